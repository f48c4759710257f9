// group.cpp — joining a group and its exchanges (see group.hpp).
#include "peers/group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "base/error.hpp"
#include "observe/log_stamp.hpp"
#include "options/options.hpp"
#include "peers/job_identity.hpp"
#include "peers/private_dir.hpp"
#include "peers/rendezvous_point.hpp"

namespace tagmem::peers {
namespace {

bool valid_group_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TAGMEM_EXPECTS(end && *end == '\0' && x >= -1 && x <= 1 << 30, TAGMEM_ERROR_INVALID_ARGUMENT,
                 std::string(name) + "='" + v + "' is not a number");
  return static_cast<int>(x);
}

// Note [hello deadline]: the hub reads one joining connection at a time, so a connection that
// sends nothing would hold up every rank queued behind it until the group's deadline: one
// silent process of the user's could make every pause wait out its whole timeout, then fail. An
// honest rank sends its hello the moment it connects (usually before the hub accepts it), so
// each connection gets at most this long for it; a silent one is dropped and named in the
// error should the group still time out.
constexpr long long kHelloWaitMs = 1000;

int hello_wait_ms(long long deadline) {
  return static_cast<int>(
      std::max<long long>(std::min(deadline - monotonic_ms(), kHelloWaitMs), 1));
}

}  // namespace

group_spec resolve_spec(const char* name, int rank, int size, int timeout_ms) {
  group_spec s;
  s.job = job_identity();
  // The default name is the same in every job: the job identity keeps the groups apart.
  s.name = name ? name : option_text(option::NCCL_GROUP);
  TAGMEM_EXPECTS(valid_group_name(s.name), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "group name '" + s.name + "' must be 1-64 characters of [A-Za-z0-9._-]");
  s.rank = rank >= 0 ? rank : env_int("LOCAL_RANK", -1);
  s.size = size > 0 ? size : env_int("LOCAL_WORLD_SIZE", -1);
  TAGMEM_EXPECTS(s.size > 0 && s.size <= 4096, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "group size " + std::to_string(s.size) +
                     " is not in 1..4096 (pass it, or set LOCAL_WORLD_SIZE)");
  TAGMEM_EXPECTS(s.rank >= 0 && s.rank < s.size, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "rank " + std::to_string(s.rank) + " is not in 0.." + std::to_string(s.size - 1) +
                     " (pass it, or set LOCAL_RANK)");
  TAGMEM_EXPECTS(timeout_ms >= 0, TAGMEM_ERROR_INVALID_ARGUMENT, "timeout_ms is negative");
  s.timeout_ms =
      timeout_ms > 0 ? timeout_ms : static_cast<int>(option_number(option::NCCL_TIMEOUT_MS));
  set_log_rank(s.rank);  // this process is that rank: TAGMEM_LOG lines say so from now on
  return s;
}

std::unique_ptr<group_session> group_session::join(const group_spec& spec, group_op op, bool ready,
                                                   tagmem_status why_code,
                                                   const std::string& why_not) {
  std::unique_ptr<group_session> s(new group_session(spec, op));
  s->members_.assign(spec.size, process_identity{});
  s->members_[spec.rank] = identity_of(::getpid());
  if (spec.rank == 0) {
    s->join_as_hub(ready, why_code, why_not);
  } else {
    s->join_as_spoke(ready, why_code, why_not);
  }
  return s;
}

group_session::~group_session() = default;

std::string group_session::describe(int r) const {
  return "rank " + std::to_string(r) + " (pid " + std::to_string(members_[r].pid) + ")";
}

std::string group_session::who() const {
  return "group '" + spec_.name + "' of job '" + spec_.job + "'";
}

int group_session::spoke_wait_ms() const {
  // The hub itself may wait up to the timeout for a slow rank before it answers.
  long long ms = 2ll * spec_.timeout_ms + 1000;
  return static_cast<int>(std::min<long long>(ms, 1 << 30));
}

void group_session::abort_all(tagmem_status code, const std::string& text) {
  std::string payload = encode_abort({code, text});
  for (auto& p : peers_) {
    if (!p) continue;
    try {
      p->send(kAbort, payload, {}, std::min(spec_.timeout_ms, 1000), "telling it to stop");
    } catch (...) {
    }
  }
  fail(code, text);
}

void group_session::send_to_hub(std::uint32_t type, const std::string& payload,
                                const std::vector<int>& fds, const char* what) {
  try {
    hub_->send(type, payload, fds, spec_.timeout_ms, what);
  } catch (const error&) {
    // Rank 0 may have stopped the group and closed before this arrived: its reason, sent
    // first, may be waiting to be read.
    std::optional<message> why;
    try {
      why = hub_->receive(std::min(spec_.timeout_ms, 1000), "reading why rank 0 stopped");
    } catch (const error&) {
    }
    if (why) check_abort(*why);
    throw;
  }
}

void group_session::check_abort(const message& m) {
  if (m.type != kAbort) return;
  abort_note a =
      decode_from(hub_->peer_name(), "being told to stop", [&] { return decode_abort(m.payload); });
  fail(a.code, a.text);
}

void group_session::join_as_hub(bool ready, tagmem_status why_code, const std::string& why_not) {
  const char* opn = op_name(op_);
  peers_.resize(spec_.size);
  std::string refusals;  // reasons why every rank must stop
  tagmem_status refusal_code = TAGMEM_SUCCESS;
  auto refuse = [&](int rank, tagmem_status code, const std::string& why) {
    if (refusal_code == TAGMEM_SUCCESS) refusal_code = code;
    refusals += (refusals.empty() ? "" : "; ") + ("rank " + std::to_string(rank) + ": " + why);
  };
  if (!ready) refuse(0, why_code, why_not);
  if (spec_.size == 1) {
    if (!ready) fail(why_code, why_not);
    return;
  }

  // Closed and unlinked, with its lock given back, before anyone is answered (see group.hpp).
  auto l = std::make_unique<rendezvous_listener>(rendezvous_paths_for(spec_.job, spec_.name),
                                                 spec_.size, who());
  const long long deadline = monotonic_ms() + spec_.timeout_ms;
  int joined = 0;
  std::string strangers;  // connections refused for their credentials or bytes
  while (joined < spec_.size - 1) {
    long long left = deadline - monotonic_ms();
    if (left <= 0) {
      std::string missing;
      for (int r = 1; r < spec_.size; ++r)
        if (!peers_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      abort_all(TAGMEM_ERROR_TIMEOUT, who() + ": rank(s) " + missing + " did not join the " + opn +
                                          " within " + std::to_string(spec_.timeout_ms) +
                                          " ms (not started, dead, or not calling " + opn + ")" +
                                          strangers);
    }
    pollfd p{l->fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    int c = ::accept4(l->fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;
    auto ch = std::make_unique<unix_channel>(c, "a process joining " + who());
    peer_credentials cred{};
    message m;
    try {
      cred = ch->credentials();
      if (cred.uid != ::geteuid()) {
        strangers +=
            "; refused pid " + std::to_string(cred.pid) + " of uid " + std::to_string(cred.uid);
        continue;
      }
      ch->set_peer_name("pid " + std::to_string(cred.pid));
      m = ch->receive(hello_wait_ms(deadline), "waiting for its hello");
    } catch (const error& e) {
      strangers += std::string("; ") + e.what();
      continue;
    }
    if (m.type != kHello) {
      strangers += "; pid " + std::to_string(cred.pid) + " sent no hello";
      continue;
    }
    std::uint32_t version = 0;
    hello h;
    try {
      version = peek_version(m.payload);
      if (version == kProtocolVersion) h = decode_hello(m.payload);
    } catch (const error&) {
      strangers += "; pid " + std::to_string(cred.pid) + " sent a malformed hello";
      continue;
    }
    if (version != kProtocolVersion) {
      peers_.push_back(std::move(ch));  // so that it hears the abort too
      abort_all(TAGMEM_ERROR_PEER, who() + ": pid " + std::to_string(cred.pid) +
                                       " runs a different tagmem build (protocol " +
                                       std::to_string(version) + ")");
    }
    std::string me = "rank 0 (pid " + std::to_string(::getpid()) + ")";
    std::string them = "rank " + std::to_string(h.rank) + " (pid " + std::to_string(cred.pid) + ")";
    ch->set_peer_name(them);
    std::string problem;
    if (h.job != spec_.job) {
      problem = them + " belongs to job '" + h.job + "', " + me + " to job '" + spec_.job +
                "': a group is one job; give each job its own identity (TAGMEM_NCCL_JOB)";
    } else if (h.group != spec_.name) {
      problem =
          them + " asked for group '" + h.group + "' at the socket of group '" + spec_.name + "'";
    } else if (h.size != spec_.size) {
      problem = them + " says the group has " + std::to_string(h.size) + " processes; " + me +
                " says " + std::to_string(spec_.size);
    } else if (h.op != op_) {
      problem = them + " called " + op_name(h.op) + " while rank 0 called " + opn;
    } else if (h.rank <= 0 || h.rank >= spec_.size) {
      problem = them + " claims a rank outside 1.." + std::to_string(spec_.size - 1);
    } else if (peers_[h.rank]) {
      problem = "two processes claim rank " + std::to_string(h.rank) + ": pid " +
                std::to_string(members_[h.rank].pid) + " and pid " + std::to_string(cred.pid);
    }
    if (!problem.empty()) {
      peers_.push_back(std::move(ch));  // so that it hears the abort too
      // And the ranks still waiting to be accepted, which would otherwise learn only that rank 0
      // closed the connection.
      for (int c2; (c2 = ::accept4(l->fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;)
        peers_.push_back(std::make_unique<unix_channel>(c2, "a process joining " + who()));
      abort_all(TAGMEM_ERROR_PEER, who() + ": " + problem);
    }
    members_[h.rank] = identity_of(cred.pid);
    if (!h.ready) refuse(h.rank, h.why_code, h.why_not);
    peers_[h.rank] = std::move(ch);
    ++joined;
  }
  l.reset();
  if (refusal_code != TAGMEM_SUCCESS) abort_all(refusal_code, who() + ": " + refusals);
  std::string w = encode_welcome({spec_.job, spec_.name, members_});
  for (int r = 1; r < spec_.size; ++r) {
    try {
      peers_[r]->send(kWelcome, w, {}, spec_.timeout_ms, "welcoming it");
    } catch (const error& e) {
      abort_all(e.code(), who() + ": " + e.what());
    }
  }
}

void group_session::join_as_spoke(bool ready, tagmem_status why_code, const std::string& why_not) {
  const char* opn = op_name(op_);
  const std::string path = rendezvous_paths_for(spec_.job, spec_.name).socket;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const long long deadline = monotonic_ms() + spec_.timeout_ms;
  int fd = -1;
  for (int pause_ms = 2;; pause_ms = std::min(pause_ms * 2, 100)) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) fail(TAGMEM_ERROR_PEER, std::string("socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    int err = errno;
    ::close(fd);
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
      fail(TAGMEM_ERROR_PEER,
           "cannot connect to the rendezvous socket '" + path + "': " + std::strerror(err));
    }
    if (monotonic_ms() >= deadline) {
      fail(TAGMEM_ERROR_TIMEOUT,
           who() + ": rank 0 did not open the rendezvous for the " + opn + " within " +
               std::to_string(spec_.timeout_ms) + " ms (is rank 0 alive and calling " + opn +
               "?); waited for '" + path + "'" +
               (private_dir_chosen_here()
                    ? ". This process chose that directory itself when it loaded the shim: the "
                      "ranks share it only when they inherit TAGMEM_NCCL_DIR from one parent "
                      "(run the launcher under LD_PRELOAD, or set TAGMEM_NCCL_DIR)"
                    : ""));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  hub_ = std::make_unique<unix_channel>(fd, "rank 0 of " + who());
  peer_credentials cred = hub_->credentials();
  if (cred.uid != ::geteuid()) {
    fail(TAGMEM_ERROR_PEER, who() + ": the process listening at '" + path + "' (pid " +
                                std::to_string(cred.pid) + ") runs as uid " +
                                std::to_string(cred.uid) + ", not as this process's uid");
  }
  hub_->set_peer_name("rank 0 (pid " + std::to_string(cred.pid) + ") of " + who());
  hello h{op_, spec_.rank, spec_.size, spec_.job, spec_.name, ready, why_code, why_not};
  send_to_hub(kHello, encode_hello(h), {}, "saying hello");
  message m = hub_->receive(spoke_wait_ms(), "waiting for all ranks to join");
  check_abort(m);
  TAGMEM_EXPECTS(m.type == kWelcome, TAGMEM_ERROR_PEER,
                 hub_->peer_name() + " answered the hello out of turn");
  welcome w = decode_from(hub_->peer_name(), "welcoming this rank",
                          [&] { return decode_welcome(m.payload); });
  std::string me =
      "rank " + std::to_string(spec_.rank) + " (pid " + std::to_string(::getpid()) + ")";
  std::string hub = "rank 0 (pid " + std::to_string(cred.pid) + ")";
  TAGMEM_EXPECTS(w.job == spec_.job && w.group == spec_.name, TAGMEM_ERROR_PEER,
                 hub + " serves group '" + w.group + "' of job '" + w.job + "', " + me +
                     " belongs to " + who() + ": a group is one job");
  TAGMEM_EXPECTS(static_cast<int>(w.members.size()) == spec_.size, TAGMEM_ERROR_PEER,
                 hub + " welcomed " + std::to_string(w.members.size()) + " ranks; " + me +
                     " expects " + std::to_string(spec_.size));
  TAGMEM_EXPECTS(w.members[0].same_as(identity_of(cred.pid)) &&
                     w.members[spec_.rank].same_as(members_[spec_.rank]),
                 TAGMEM_ERROR_PEER,
                 hub + " names " + w.members[0].describe() + " as rank 0 and " +
                     w.members[spec_.rank].describe() + " as " + me +
                     ": not the processes "
                     "connected");
  members_ = std::move(w.members);
}

std::vector<std::string> group_session::all_gather(const std::string& blob, const char* what) {
  std::vector<std::string> all(spec_.size);
  if (spec_.rank != 0) {
    send_to_hub(kGather, blob, {}, what);
    message m = hub_->receive(spoke_wait_ms(), what);
    check_abort(m);
    TAGMEM_EXPECTS(m.type == kGathered, TAGMEM_ERROR_PEER,
                   hub_->peer_name() + " answered out of turn while " + what);
    all = decode_from(hub_->peer_name(), what, [&] { return decode_list(m.payload); });
    TAGMEM_EXPECTS(static_cast<int>(all.size()) == spec_.size, TAGMEM_ERROR_PEER,
                   hub_->peer_name() + " gathered " + std::to_string(all.size()) +
                       " contributions for " + std::to_string(spec_.size) + " ranks");
    return all;
  }
  all[0] = blob;
  try {
    for (int r = 1; r < spec_.size; ++r) {
      message m = peers_[r]->receive(spec_.timeout_ms, what);
      TAGMEM_EXPECTS(m.type == kGather, TAGMEM_ERROR_PEER,
                     peers_[r]->peer_name() + " is out of step while " + what);
      all[r] = std::move(m.payload);
    }
    std::string packed = encode_list(all);
    for (int r = 1; r < spec_.size; ++r)
      peers_[r]->send(kGathered, packed, {}, spec_.timeout_ms, what);
  } catch (const error& e) {
    abort_all(e.code(), who() + ": " + e.what());
  }
  return all;
}

namespace {

// Duplicates of borrowed descriptors, for a letter that does not leave this process.
owned_fds duplicates(const std::vector<int>& fds) {
  owned_fds copies;
  for (int fd : fds) {
    int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
      fail(TAGMEM_ERROR_PEER,
           std::string("cannot duplicate a descriptor for a letter: ") + std::strerror(errno));
    }
    copies.push_back(copy);
  }
  return copies;
}

}  // namespace

void group_session::mail(const std::vector<letter>& outbox, const letter_handler& on_receive,
                         const char* what) {
  auto to_self = [&](const letter& l) {
    owned_fds copies = duplicates(l.fds);
    on_receive(spec_.rank, l.blob, copies);
  };
  const int wait_ms = static_cast<int>(
      std::min<long long>(static_cast<long long>(spec_.timeout_ms) * (spec_.size + 1), 1 << 30));
  if (spec_.rank != 0) {
    for (;;) {
      message m = hub_->receive(wait_ms, what);
      check_abort(m);
      if (m.type == kMailDone) return;
      if (m.type == kMailDeliver) {
        routed_blob d =
            decode_from(hub_->peer_name(), what, [&] { return decode_routed(m.payload); });
        TAGMEM_EXPECTS(d.rank >= 0 && d.rank < spec_.size && d.rank != spec_.rank,
                       TAGMEM_ERROR_PEER,
                       hub_->peer_name() + " delivered a letter from rank " +
                           std::to_string(d.rank) + " while " + what);
        on_receive(d.rank, d.blob, m.fds);
        m.fds.reset();
        send_to_hub(kMailAck, {}, {}, what);
        continue;
      }
      TAGMEM_EXPECTS(m.type == kMailTurn, TAGMEM_ERROR_PEER,
                     hub_->peer_name() + " answered out of turn while " + what);
      for (const letter& l : outbox) {
        if (l.to == spec_.rank) {
          to_self(l);
          continue;
        }
        send_to_hub(kMailItem, encode_routed({l.to, l.blob}), l.fds, what);
        message ack = hub_->receive(spoke_wait_ms(), what);
        check_abort(ack);
        TAGMEM_EXPECTS(ack.type == kMailAck, TAGMEM_ERROR_PEER,
                       hub_->peer_name() + " answered out of turn while " + what);
      }
      send_to_hub(kMailEnd, {}, {}, what);
    }
  }
  // The hub: one source at a time, one letter at a time. `fds` are closed whatever happens.
  auto deliver = [&](int from, int to, const std::string& blob, owned_fds& fds) {
    TAGMEM_EXPECTS(
        to >= 0 && to < spec_.size && to != from, TAGMEM_ERROR_PEER,
        describe(from) + " sent a letter for rank " + std::to_string(to) + " while " + what);
    if (to == 0) {
      on_receive(from, blob, fds);
      return;
    }
    peers_[to]->send(kMailDeliver, encode_routed({from, blob}), fds.view(), spec_.timeout_ms, what);
    fds.reset();
    message ack = peers_[to]->receive(spec_.timeout_ms, what);
    TAGMEM_EXPECTS(ack.type == kMailAck, TAGMEM_ERROR_PEER,
                   peers_[to]->peer_name() + " is out of step while " + what);
  };
  try {
    for (int s = 0; s < spec_.size; ++s) {
      if (s == 0) {
        for (const letter& l : outbox) {
          if (l.to == 0) {
            to_self(l);
            continue;
          }
          owned_fds copies = duplicates(l.fds);
          deliver(0, l.to, l.blob, copies);
        }
        continue;
      }
      peers_[s]->send(kMailTurn, {}, {}, spec_.timeout_ms, what);
      for (;;) {
        message m = peers_[s]->receive(spec_.timeout_ms, what);
        if (m.type == kMailEnd) break;
        TAGMEM_EXPECTS(m.type == kMailItem, TAGMEM_ERROR_PEER,
                       peers_[s]->peer_name() + " is out of step while " + what);
        routed_blob item =
            decode_from(peers_[s]->peer_name(), what, [&] { return decode_routed(m.payload); });
        deliver(s, item.rank, item.blob, m.fds);
        peers_[s]->send(kMailAck, {}, {}, spec_.timeout_ms, what);
      }
    }
    for (int r = 1; r < spec_.size; ++r) peers_[r]->send(kMailDone, {}, {}, spec_.timeout_ms, what);
  } catch (const error& e) {
    abort_all(e.code(), who() + ": " + e.what());
  }
}

std::vector<rank_outcome> group_session::outcomes(const rank_outcome& mine, const char* what) {
  std::vector<rank_outcome> out;
  for (const std::string& b : all_gather(encode_outcome(mine), what)) {
    out.push_back(decode_from(describe(static_cast<int>(out.size())), what,
                              [&] { return decode_outcome(b); }));
  }
  return out;
}

}  // namespace tagmem::peers
