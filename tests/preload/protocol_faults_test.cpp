// protocol_faults_test.cpp — the rendezvous protocol when a peer dies, stalls or is not what it
// claims, at each step: joining (hello/welcome), all_gather, mail and the outcome exchange, on
// the hub's side and on a spoke's. Three processes form each group: the misbehaving one and two
// real ranks (group_session), which must each end with PEER or TIMEOUT naming the misbehaving
// rank; none may outlive its bound (a process still running long after it is reported as a
// hang). The impostors speak the wire protocol directly (messages.hpp, unix_channel.hpp). Also:
// no descriptor received on an error path is left open, and a payload that announces more items
// than it holds is refused before anything is sized from it.
//
// This binary links the rendezvous code itself (no shim, no driver): the group layer needs
// neither.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "base/error.hpp"
#include "peers/group.hpp"
#include "peers/messages.hpp"
#include "peers/rendezvous_point.hpp"
#include "peers/unix_channel.hpp"
#include "peers/wire.hpp"

namespace tagmem::nccl {
namespace {

using namespace tagmem::peers;

constexpr int kTimeoutMs = 500;
constexpr int kSize = 3;

enum class step { join, gather, mail, outcome };
enum class misdeed { die, stall, impersonate };
const char* step_name(step s) {
  static const char* n[] = {"join", "gather", "mail", "outcome"};
  return n[static_cast<int>(s)];
}

std::string unique_name(const std::string& what) {
  static int counter = 0;
  return "p" + std::to_string(::getpid()) + "-" + std::to_string(++counter) + "-" + what;
}

// Fixed before any child is forked, so that every process of a test has the same.
const std::string g_job = "protocol-test-" + std::to_string(::getpid());

group_spec spec_for(const std::string& group, int rank) {
  group_spec s;
  s.job = g_job;
  s.name = group;
  s.rank = rank;
  s.size = kSize;
  s.timeout_ms = kTimeoutMs;
  return s;
}

// A child process's result: its status and message, through a pipe.
struct child {
  pid_t pid = -1;
  int out = -1;
};

child start(const std::function<rank_outcome()>& body) {
  int p[2];
  if (::pipe(p) != 0) throw std::runtime_error("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    rank_outcome o;
    try {
      o = body();
    } catch (const error& e) {
      o = {e.code(), e.what()};
    } catch (const std::exception& e) {
      o = {TAGMEM_ERROR_INTERNAL, e.what()};
    }
    std::string bytes = encode_outcome(o);
    (void)!::write(p[1], bytes.data(), bytes.size());
    ::_exit(0);
  }
  ::close(p[1]);
  return {pid, p[0]};
}

// Waits for the child; a child still running after `limit_ms` is killed and reported as hung.
rank_outcome finish(child& c, int limit_ms = 20000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  int status = 0;
  while (::waitpid(c.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
      ::close(c.out);
      return {TAGMEM_ERROR_INTERNAL, "HUNG"};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string bytes;
  char buf[4096];
  for (ssize_t n; (n = ::read(c.out, buf, sizeof buf)) > 0;) bytes.append(buf, n);
  ::close(c.out);
  if (bytes.empty()) return {TAGMEM_ERROR_INTERNAL, "exited without a result"};
  return decode_outcome(bytes);
}

// A real rank going through every step.
rank_outcome honest(const std::string& group, int rank) {
  auto s = group_session::join(spec_for(group, rank), group_op::pause, true, TAGMEM_SUCCESS, "");
  s->all_gather("blob of rank " + std::to_string(rank), "gathering");
  std::vector<letter> out;
  for (int to = 0; to < kSize; ++to)
    if (to != rank) out.push_back({to, "letter", {}});
  s->mail(
      out, [](int, const std::string&, owned_fds&) {}, "mailing");
  auto all = s->outcomes({}, "telling outcomes");
  for (const rank_outcome& o : all)
    if (o.status != TAGMEM_SUCCESS) return o;
  return {};
}

[[noreturn]] void misbehave_by_dying_or_stalling(misdeed m) {
  if (m == misdeed::die) ::raise(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(8 * kTimeoutMs));
  ::_exit(0);
}

std::unique_ptr<unix_channel> connect_to(const std::string& group) {
  std::string path = rendezvous_paths_for(spec_for(group, 1).job, group).socket;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  for (int i = 0; i < 400; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
      return std::make_unique<unix_channel>(fd, "rank 0");
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw std::runtime_error("no rank 0 to connect to");
}

hello hello_of(const std::string& group, int rank) {
  group_spec s = spec_for(group, rank);
  return {group_op::pause, rank, kSize, s.job, group, true, TAGMEM_SUCCESS, ""};
}

// Rank 1, spoken by hand: behaves until `at`, then commits `m`.
rank_outcome rogue_spoke(const std::string& group, step at, misdeed m) {
  if (at == step::join && m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
  auto hub = connect_to(group);
  hello h = hello_of(group, 1);
  if (at == step::join) {
    h.job = "another-job";  // a process of another job, same group name
    // After the real ranks reached rank 0, so that they hear why the group stops (a rank that
    // comes later finds no rank 0, and can say only that).
    std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs / 2));
  }
  hub->send(kHello, encode_hello(h), {}, 2000, "hello");
  message w = hub->receive(4000, "welcome");
  if (at == step::join) return {};
  if (at == step::gather) {
    if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
    hub->send(kMailEnd, {}, {}, 2000, "out of turn");  // not what the step expects
    hub->receive(4000, "abort");
    return {};
  }
  hub->send(kGather, "rogue", {}, 2000, "gather");
  hub->receive(4000, "gathered");
  // Mail: deliveries from rank 0 come before rank 1's turn.
  for (;;) {
    message x = hub->receive(4000, "mail");
    if (x.type == kMailDeliver) {
      hub->send(kMailAck, {}, {}, 2000, "ack");
      continue;
    }
    if (x.type != kMailTurn) return {TAGMEM_ERROR_INTERNAL, "unexpected message in mail"};
    break;
  }
  if (at == step::mail) {
    if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    hub->send(kMailItem, encode_routed({99, "for nobody"}), {fds[0], fds[1]}, 2000, "letter");
    hub->receive(4000, "abort");
    return {};
  }
  hub->send(kMailEnd, {}, {}, 2000, "mail end");
  for (;;) {
    message x = hub->receive(4000, "mail");
    if (x.type == kMailDeliver) {
      hub->send(kMailAck, {}, {}, 2000, "ack");
      continue;
    }
    break;  // kMailDone
  }
  // Outcome.
  if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
  hub->send(kGather, std::string("\x01\x00\x00", 3), {}, 2000, "a malformed outcome");
  hub->receive(4000, "gathered");
  return {};
}

// Rank 0, spoken by hand: behaves until `at`, then commits `m`.
rank_outcome rogue_hub(const std::string& group, step at, misdeed m) {
  group_spec s = spec_for(group, 0);
  rendezvous_listener l(rendezvous_paths_for(s.job, group), kSize, "rogue");
  std::vector<std::unique_ptr<unix_channel>> peers(kSize);
  std::vector<process_identity> members(kSize);
  members[0] = identity_of(::getpid());
  for (int joined = 0; joined < kSize - 1;) {
    int c = ::accept4(l.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    auto ch = std::make_unique<unix_channel>(c, "spoke");
    hello h = decode_hello(ch->receive(4000, "hello").payload);
    members[h.rank] = identity_of(ch->credentials().pid);
    peers[h.rank] = std::move(ch);
    ++joined;
  }
  auto to_all = [&](std::uint32_t type, const std::string& payload, std::vector<int> fds = {}) {
    for (int r = 1; r < kSize; ++r) peers[r]->send(type, payload, fds, 2000, "rogue");
  };
  if (at == step::join) {
    if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
    to_all(kWelcome, encode_welcome({"another-job", group, members}));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return {};
  }
  to_all(kWelcome, encode_welcome({s.job, group, members}));
  for (int r = 1; r < kSize; ++r) peers[r]->receive(4000, "gather");
  if (at == step::gather) {
    if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
    // A list that announces a billion items in a few bytes.
    to_all(kGathered, wire_writer().u32(1u << 30).u32(0).take());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return {};
  }
  to_all(kGathered, encode_list({"a", "b", "c"}));
  if (at == step::mail) {
    if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    to_all(kMailDeliver, encode_routed({77, "from nobody"}), {fds[0], fds[1]});
    ::close(fds[0]);
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return {};
  }
  to_all(kMailDone, {});
  for (int r = 1; r < kSize; ++r) peers[r]->receive(4000, "outcome");
  if (m != misdeed::impersonate) misbehave_by_dying_or_stalling(m);
  to_all(kGathered, encode_list({"\x05", encode_outcome({}), encode_outcome({})}));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return {};
}

bool names_rank(const std::string& text, int rank) {
  std::string r = std::to_string(rank);
  for (const std::string& form : {"rank " + r + " ", "rank " + r + ":", "rank(s) " + r})
    if (text.find(form) != std::string::npos) return true;
  return false;
}

// Every step with one misdeed by `bad` (0: the hub, 1: a spoke); the steps run at once.
void sweep(int bad, misdeed m) {
  struct run {
    step at;
    std::vector<child> ranks;
  };
  std::vector<run> runs;
  for (step at : {step::join, step::gather, step::mail, step::outcome}) {
    std::string group = unique_name(step_name(at));
    run r{at, {}};
    for (int rank = 0; rank < kSize; ++rank) {
      if (rank == bad) {
        r.ranks.push_back(
            start([=] { return bad == 0 ? rogue_hub(group, at, m) : rogue_spoke(group, at, m); }));
      } else {
        r.ranks.push_back(start([=] { return honest(group, rank); }));
      }
    }
    runs.push_back(std::move(r));
  }
  for (run& r : runs) {
    for (int rank = 0; rank < kSize; ++rank) {
      rank_outcome o = finish(r.ranks[rank]);
      if (rank == bad) {
        EXPECT_NE(o.message, "HUNG") << "the misbehaving rank at " << step_name(r.at);
        continue;
      }
      SCOPED_TRACE(std::string("step ") + step_name(r.at) + ", rank " + std::to_string(rank));
      EXPECT_TRUE(o.status == TAGMEM_ERROR_PEER || o.status == TAGMEM_ERROR_TIMEOUT)
          << o.status << ": " << o.message;
      EXPECT_TRUE(names_rank(o.message, bad)) << o.message;
    }
  }
}

TEST(ProtocolFaults, SpokeDiesAtEachStep) { sweep(1, misdeed::die); }
TEST(ProtocolFaults, SpokeStallsAtEachStep) { sweep(1, misdeed::stall); }
TEST(ProtocolFaults, SpokeImpersonatesAtEachStep) { sweep(1, misdeed::impersonate); }
TEST(ProtocolFaults, HubDiesAtEachStep) { sweep(0, misdeed::die); }
TEST(ProtocolFaults, HubStallsAtEachStep) { sweep(0, misdeed::stall); }
TEST(ProtocolFaults, HubImpersonatesAtEachStep) { sweep(0, misdeed::impersonate); }

// A member of a 2-rank group with a timeout long enough to tell a dropped connection from one
// waited out: joins and gathers.
rank_outcome patient_member(const std::string& group, int rank) {
  group_spec s = spec_for(group, rank);
  s.size = 2;
  s.timeout_ms = 8000;
  auto session = group_session::join(s, group_op::pause, true, TAGMEM_SUCCESS, "");
  session->all_gather("blob", "gathering");
  return {};
}

// Note [hello deadline]: a connection that reaches rank 0 first and never says hello is dropped
// after its own short wait; the rank queued behind it joins and the group goes on, instead of
// every rank waiting out the group's timeout and failing.
TEST(ProtocolFaults, ASilentConnectionDoesNotHoldUpTheRanksBehindIt) {
  std::string group = unique_name("silent");
  child hub = start([&] { return patient_member(group, 0); });
  auto silent = connect_to(group);  // first in rank 0's queue; says nothing, stays open
  child spoke = start([&] { return patient_member(group, 1); });
  rank_outcome h = finish(hub);
  rank_outcome k = finish(spoke);
  EXPECT_EQ(h.status, TAGMEM_SUCCESS) << h.message;
  EXPECT_EQ(k.status, TAGMEM_SUCCESS) << k.message;
}

// ---- descriptors on error paths ---------------------------------------------------------------

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// This process is the hub of a 2-rank group; `spoke` runs in a child.
rank_outcome hub_against(const std::string& group, const std::function<void()>& spoke) {
  child c = start([&] {
    spoke();
    return rank_outcome{};
  });
  group_spec s = spec_for(group, 0);
  s.size = 2;
  rank_outcome mine;
  try {
    auto session = group_session::join(s, group_op::pause, true, TAGMEM_SUCCESS, "");
    session->mail(
        {}, [](int, const std::string&, owned_fds&) {}, "mailing");
  } catch (const error& e) {
    mine = {e.code(), e.what()};
  }
  finish(c);
  return mine;
}

hello two_rank_hello(const std::string& group) {
  hello h = hello_of(group, 1);
  h.size = 2;
  return h;
}

TEST(ProtocolFaults, HubClosesDescriptorsThatCameWithAMessageOtherThanAHello) {
  std::string group = unique_name("nohello");
  int before = open_fds();
  rank_outcome o = hub_against(group, [&] {
    auto hub = connect_to(group);
    int fds[2];
    if (::pipe(fds) != 0) return;
    hub->send(kGather, "not a hello", {fds[0], fds[1], fds[0]}, 2000, "stray");
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * kTimeoutMs));
  });
  EXPECT_EQ(o.status, TAGMEM_ERROR_TIMEOUT) << o.message;
  EXPECT_NE(o.message.find("sent no hello"), std::string::npos) << o.message;
  EXPECT_EQ(open_fds(), before);
}

// A spoke of a 2-rank group that joins, and on its mail turn sends `payload` as a letter with
// two descriptors.
void letter_with_fds(const std::string& group, const std::string& payload) {
  auto hub = connect_to(group);
  hub->send(kHello, encode_hello(two_rank_hello(group)), {}, 2000, "hello");
  hub->receive(4000, "welcome");
  hub->receive(4000, "turn");
  int fds[2];
  if (::pipe(fds) != 0) return;
  hub->send(kMailItem, payload, {fds[0], fds[1]}, 2000, "letter");
  hub->receive(4000, "abort");
}

TEST(ProtocolFaults, HubClosesDescriptorsOfALetterForNoRank) {
  std::string group = unique_name("noone");
  int before = open_fds();
  rank_outcome o = hub_against(group, [&] { letter_with_fds(group, encode_routed({5, "x"})); });
  EXPECT_EQ(o.status, TAGMEM_ERROR_PEER) << o.message;
  EXPECT_NE(o.message.find("letter for rank 5"), std::string::npos) << o.message;
  EXPECT_EQ(open_fds(), before);
}

TEST(ProtocolFaults, HubClosesDescriptorsOfAMalformedLetter) {
  std::string group = unique_name("badletter");
  int before = open_fds();
  rank_outcome o = hub_against(group, [&] { letter_with_fds(group, "\x01"); });
  EXPECT_EQ(o.status, TAGMEM_ERROR_PEER) << o.message;
  EXPECT_NE(o.message.find("rank 1 (pid"), std::string::npos) << o.message;
  EXPECT_EQ(open_fds(), before);
}

TEST(ProtocolFaults, AListAnnouncingMoreItemsThanItHoldsIsRefusedBeforeSizing) {
  std::string packed = wire_writer().u32(0xffffffffu).take();
  try {
    decode_list(packed);
    ADD_FAILURE() << "accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), TAGMEM_ERROR_PEER);
  }
}

}  // namespace
}  // namespace tagmem::nccl
