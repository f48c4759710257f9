// group.cpp — joining a group and its exchanges (see group.hpp).
#include "group.hpp"

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
#include <thread>

#include "error.hpp"
#include "private_dir.hpp"
#include "wire.hpp"

namespace tagmem::nccl {
namespace {

constexpr std::uint32_t kVersion = 1;

enum : std::uint32_t {
  kHello = 1,
  kWelcome,
  kAbort,
  kGather,
  kGathered,
  kMailTurn,
  kMailItem,
  kMailEnd,
  kMailDeliver,
  kMailAck,
  kMailDone,
};

bool valid_group_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string sanitized(std::string s) {
  for (char& c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      c = '_';
  }
  return s.substr(0, 64);
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TAGMEM_EXPECTS(end && *end == '\0' && x >= -1 && x <= 1 << 30, TAGMEM_ERROR_INVALID_ARGUMENT,
                 std::string(name) + "='" + v + "' is not a number");
  return static_cast<int>(x);
}

std::string socket_path(const std::string& name) {
  std::string path = private_dir() + "/" + name + ".sock";
  TAGMEM_EXPECTS(path.size() < sizeof(sockaddr_un{}.sun_path), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "the rendezvous socket path '" + path + "' is too long for a Unix socket; set " +
                     "TAGMEM_NCCL_DIR to a shorter directory");
  return path;
}

sockaddr_un address_of(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

std::string encode_abort(tagmem_status code, const std::string& text) {
  return wire_writer().u32(code).str(text).take();
}

}  // namespace

const char* op_name(group_op op) { return op == group_op::pause ? "pause" : "resume"; }

group_spec resolve_spec(const char* name, int rank, int size, int timeout_ms) {
  group_spec s;
  if (name) {
    s.name = name;
  } else if (const char* g = std::getenv("TAGMEM_NCCL_GROUP"); g && *g) {
    s.name = g;
  } else if (const char* id = std::getenv("TORCHELASTIC_RUN_ID");
             id && *id && std::strcmp(id, "none") != 0) {
    s.name = sanitized(std::string("torchrun-") + id);
  } else if (const char* port = std::getenv("MASTER_PORT"); port && *port) {
    const char* addr = std::getenv("MASTER_ADDR");
    s.name = sanitized(std::string("job-") + (addr ? addr : "") + "-" + port);
  } else {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT,
         "no group name: pass one, or set TAGMEM_NCCL_GROUP (torchrun sets TORCHELASTIC_RUN_ID)");
  }
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
  s.timeout_ms = timeout_ms > 0 ? timeout_ms : env_int("TAGMEM_NCCL_TIMEOUT_MS", 60000);
  TAGMEM_EXPECTS(s.timeout_ms > 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "TAGMEM_NCCL_TIMEOUT_MS must be positive");
  return s;
}

std::unique_ptr<group_session> group_session::join(const group_spec& spec, group_op op, bool ready,
                                                   tagmem_status why_code,
                                                   const std::string& why_not) {
  std::unique_ptr<group_session> s(new group_session(spec, op));
  s->pids_.assign(spec.size, 0);
  s->pids_[spec.rank] = ::getpid();
  if (spec.rank == 0) {
    s->join_as_hub(ready, why_code, why_not);
  } else {
    s->join_as_spoke(ready, why_code, why_not);
  }
  return s;
}

group_session::~group_session() = default;

int group_session::rank_of_pid(pid_t pid) const {
  for (int r = 0; r < spec_.size; ++r)
    if (pids_[r] == pid) return r;
  return -1;
}

int group_session::spoke_wait_ms() const {
  // The hub itself may wait up to the timeout for a slow rank before it answers.
  long long ms = 2ll * spec_.timeout_ms + 1000;
  return static_cast<int>(std::min<long long>(ms, 1 << 30));
}

void group_session::abort_all(tagmem_status code, const std::string& text) {
  std::string payload = encode_abort(code, text);
  for (auto& p : peers_) {
    if (!p) continue;
    try {
      p->send(kAbort, payload, {}, std::min(spec_.timeout_ms, 1000), "telling it to stop");
    } catch (...) {
    }
  }
  fail(code, text);
}

void group_session::check_abort(message& m) {
  if (m.type != kAbort) return;
  for (int fd : m.fds) ::close(fd);
  wire_reader r(m.payload);
  auto code = static_cast<tagmem_status>(r.u32());
  fail(code, r.str());
}

void group_session::join_as_hub(bool ready, tagmem_status why_code, const std::string& why_not) {
  const std::string& g = spec_.name;
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

  const std::string path = socket_path(g);
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) fail(TAGMEM_ERROR_PEER, std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr = address_of(path);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(lfd);
    if (err != EADDRINUSE) {
      fail(TAGMEM_ERROR_PEER,
           "cannot bind the rendezvous socket '" + path + "': " + std::strerror(err));
    }
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live =
        probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) ::close(probe);
    fail(TAGMEM_ERROR_PEER,
         live ? "group '" + g + "': another process is already rank 0 (its socket '" + path +
                    "' is live); give each job its own group name"
              : "group '" + g + "': the rendezvous socket '" + path +
                    "' exists but nobody listens on it: a run that did not finish left it. "
                    "Remove it (tagmem deletes only files it created) or use another group name");
  }
  // From here the socket file is ours: it goes when the join ends, whatever happens.
  struct listener {
    int fd;
    std::string path;
    ~listener() {
      if (fd >= 0) ::close(fd);
      ::unlink(path.c_str());
    }
  };
  std::unique_ptr<listener> l(new listener{lfd, path});
  if (::listen(lfd, spec_.size) != 0) {
    fail(TAGMEM_ERROR_PEER, "listen on '" + path + "': " + std::strerror(errno));
  }

  const long long deadline = monotonic_ms() + spec_.timeout_ms;
  int joined = 0;
  std::string strangers;  // connections refused for their credentials
  while (joined < spec_.size - 1) {
    long long left = deadline - monotonic_ms();
    if (left <= 0) {
      std::string missing;
      for (int r = 1; r < spec_.size; ++r)
        if (!peers_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      abort_all(TAGMEM_ERROR_TIMEOUT,
                "group '" + g + "': rank(s) " + missing + " did not join the " + opn + " within " +
                    std::to_string(spec_.timeout_ms) + " ms (not started, dead, or not calling " +
                    opn + ")" + strangers);
    }
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;
    auto ch = std::make_unique<unix_channel>(c, "a process joining group '" + g + "'");
    peer_credentials cred{};
    message hello;
    try {
      cred = ch->credentials();
      if (cred.uid != ::geteuid()) {
        strangers +=
            "; refused pid " + std::to_string(cred.pid) + " of uid " + std::to_string(cred.uid);
        continue;
      }
      ch->set_peer_name("pid " + std::to_string(cred.pid));
      hello = ch->receive(static_cast<int>(std::max<long long>(deadline - monotonic_ms(), 1)),
                          "waiting for its hello");
    } catch (const error& e) {
      strangers += std::string("; ") + e.what();
      continue;
    }
    if (hello.type != kHello) continue;
    for (int fd : hello.fds) ::close(fd);
    std::uint32_t version = 0;
    group_op op{};
    int rank = -1, size = 0;
    std::string name, peer_why;
    bool peer_ready = false;
    tagmem_status peer_code = TAGMEM_SUCCESS;
    try {
      wire_reader r(hello.payload);
      version = r.u32();
      op = static_cast<group_op>(r.u32());
      rank = r.i32();
      size = r.i32();
      name = r.str();
      peer_ready = r.u32() != 0;
      peer_code = static_cast<tagmem_status>(r.u32());
      peer_why = r.str();
    } catch (const error&) {
      strangers += "; pid " + std::to_string(cred.pid) + " sent a malformed hello";
      continue;
    }
    std::string who = "rank " + std::to_string(rank) + " (pid " + std::to_string(cred.pid) + ")";
    ch->set_peer_name(who);
    std::string problem;
    if (version != kVersion) {
      problem = who + " runs a different tagmem build (protocol " + std::to_string(version) + ")";
    } else if (name != g) {
      problem = who + " asked for group '" + name + "' at the socket of group '" + g + "'";
    } else if (size != spec_.size) {
      problem = who + " says group '" + g + "' has " + std::to_string(size) +
                " processes; rank 0 says " + std::to_string(spec_.size);
    } else if (op != op_) {
      problem = who + " called " + op_name(op) + " while rank 0 called " + opn;
    } else if (rank <= 0 || rank >= spec_.size) {
      problem = who + " claims a rank outside 1.." + std::to_string(spec_.size - 1);
    } else if (peers_[rank]) {
      problem = "two processes claim rank " + std::to_string(rank) + " of group '" + g + "': pid " +
                std::to_string(pids_[rank]) + " and pid " + std::to_string(cred.pid);
    }
    if (!problem.empty()) {
      peers_.push_back(std::move(ch));  // so that it hears the abort too
      abort_all(TAGMEM_ERROR_PEER, "group '" + g + "': " + problem);
    }
    pids_[rank] = cred.pid;
    if (!peer_ready) refuse(rank, peer_code, peer_why);
    peers_[rank] = std::move(ch);
    ++joined;
  }
  l.reset();  // Note: closed and unlinked before anyone is answered (see group.hpp)
  if (refusal_code != TAGMEM_SUCCESS) abort_all(refusal_code, "group '" + g + "': " + refusals);
  wire_writer w;
  w.u32(static_cast<std::uint32_t>(spec_.size));
  for (pid_t pid : pids_) w.u64(static_cast<std::uint64_t>(pid));
  std::string welcome = w.take();
  for (int r = 1; r < spec_.size; ++r) {
    try {
      peers_[r]->send(kWelcome, welcome, {}, spec_.timeout_ms, "welcoming it");
    } catch (const error& e) {
      abort_all(e.code(), "group '" + g + "': " + e.what());
    }
  }
}

void group_session::join_as_spoke(bool ready, tagmem_status why_code, const std::string& why_not) {
  const std::string& g = spec_.name;
  const char* opn = op_name(op_);
  const std::string path = socket_path(g);
  sockaddr_un addr = address_of(path);
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
      fail(TAGMEM_ERROR_TIMEOUT, "group '" + g + "': rank 0 did not open the rendezvous for the " +
                                     opn + " within " + std::to_string(spec_.timeout_ms) +
                                     " ms (is rank 0 alive and calling " + opn +
                                     "?); waited for '" + path + "'");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  hub_ = std::make_unique<unix_channel>(fd, "rank 0 of group '" + g + "'");
  peer_credentials cred = hub_->credentials();
  if (cred.uid != ::geteuid()) {
    fail(TAGMEM_ERROR_PEER, "group '" + g + "': the process listening at '" + path + "' (pid " +
                                std::to_string(cred.pid) + ") runs as uid " +
                                std::to_string(cred.uid) + ", not as this process's uid");
  }
  hub_->set_peer_name("rank 0 (pid " + std::to_string(cred.pid) + ") of group '" + g + "'");
  std::string hello = wire_writer()
                          .u32(kVersion)
                          .u32(static_cast<std::uint32_t>(op_))
                          .i32(spec_.rank)
                          .i32(spec_.size)
                          .str(g)
                          .u32(ready ? 1 : 0)
                          .u32(why_code)
                          .str(why_not)
                          .take();
  hub_->send(kHello, hello, {}, spec_.timeout_ms, "saying hello");
  message m = hub_->receive(spoke_wait_ms(), "waiting for all ranks to join");
  check_abort(m);
  TAGMEM_EXPECTS(m.type == kWelcome, TAGMEM_ERROR_PEER, "rank 0 answered out of turn");
  wire_reader r(m.payload);
  TAGMEM_EXPECTS(static_cast<int>(r.u32()) == spec_.size, TAGMEM_ERROR_PEER, "bad welcome");
  for (pid_t& pid : pids_) pid = static_cast<pid_t>(r.u64());
}

std::vector<std::string> group_session::all_gather(const std::string& blob, const char* what) {
  std::vector<std::string> all(spec_.size);
  if (spec_.rank != 0) {
    hub_->send(kGather, blob, {}, spec_.timeout_ms, what);
    message m = hub_->receive(spoke_wait_ms(), what);
    check_abort(m);
    TAGMEM_EXPECTS(m.type == kGathered, TAGMEM_ERROR_PEER, "rank 0 answered out of turn");
    all = unpack_list(m.payload);
    TAGMEM_EXPECTS(static_cast<int>(all.size()) == spec_.size, TAGMEM_ERROR_PEER, "bad gather");
    return all;
  }
  all[0] = blob;
  try {
    for (int r = 1; r < spec_.size; ++r) {
      message m = peers_[r]->receive(spec_.timeout_ms, what);
      for (int fd : m.fds) ::close(fd);
      TAGMEM_EXPECTS(m.type == kGather, TAGMEM_ERROR_PEER,
                     peers_[r]->peer_name() + " is out of step while " + what);
      all[r] = std::move(m.payload);
    }
    std::string packed = pack_list(all);
    for (int r = 1; r < spec_.size; ++r)
      peers_[r]->send(kGathered, packed, {}, spec_.timeout_ms, what);
  } catch (const error& e) {
    abort_all(e.code(), "group '" + spec_.name + "': " + e.what());
  }
  return all;
}

void group_session::mail(const std::vector<letter>& outbox, const letter_handler& on_receive,
                         const char* what) {
  auto to_self = [&](const letter& l) {
    std::vector<int> copies;
    for (int fd : l.fds) copies.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
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
        wire_reader r(m.payload);
        int from = r.i32();
        std::string blob = r.str();
        on_receive(from, blob, m.fds);
        hub_->send(kMailAck, {}, {}, spec_.timeout_ms, what);
        continue;
      }
      TAGMEM_EXPECTS(m.type == kMailTurn, TAGMEM_ERROR_PEER, "rank 0 answered out of turn");
      for (const letter& l : outbox) {
        if (l.to == spec_.rank) {
          to_self(l);
          continue;
        }
        hub_->send(kMailItem, wire_writer().i32(l.to).str(l.blob).take(), l.fds, spec_.timeout_ms,
                   what);
        message ack = hub_->receive(spoke_wait_ms(), what);
        check_abort(ack);
        TAGMEM_EXPECTS(ack.type == kMailAck, TAGMEM_ERROR_PEER, "rank 0 answered out of turn");
      }
      hub_->send(kMailEnd, {}, {}, spec_.timeout_ms, what);
    }
  }
  // The hub: one source at a time, one letter at a time.
  auto deliver = [&](int from, int to, const std::string& blob, std::vector<int>& fds) {
    TAGMEM_EXPECTS(to >= 0 && to < spec_.size, TAGMEM_ERROR_PEER,
                   "a letter for rank " + std::to_string(to) + ", outside the group");
    if (to == 0) {
      on_receive(from, blob, fds);
      return;
    }
    try {
      peers_[to]->send(kMailDeliver, wire_writer().i32(from).str(blob).take(), fds,
                       spec_.timeout_ms, what);
    } catch (...) {
      for (int fd : fds) ::close(fd);
      throw;
    }
    for (int fd : fds) ::close(fd);
    message ack = peers_[to]->receive(spec_.timeout_ms, what);
    for (int fd : ack.fds) ::close(fd);
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
          std::vector<int> copies;
          for (int fd : l.fds) copies.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
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
        wire_reader r(m.payload);
        int to = r.i32();
        std::string blob = r.str();
        deliver(s, to, blob, m.fds);
        peers_[s]->send(kMailAck, {}, {}, spec_.timeout_ms, what);
      }
    }
    for (int r = 1; r < spec_.size; ++r) peers_[r]->send(kMailDone, {}, {}, spec_.timeout_ms, what);
  } catch (const error& e) {
    abort_all(e.code(), "group '" + spec_.name + "': " + e.what());
  }
}

std::vector<rank_outcome> group_session::outcomes(const rank_outcome& mine, const char* what) {
  std::string blob = wire_writer().u32(mine.status).str(mine.message).take();
  std::vector<rank_outcome> out;
  for (const std::string& b : all_gather(blob, what)) {
    wire_reader r(b);
    rank_outcome o;
    o.status = static_cast<tagmem_status>(r.u32());
    o.message = r.str();
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace tagmem::nccl
