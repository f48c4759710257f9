// ipc_server.cpp — the exporting side of tagged-memory IPC (Note [ipc] in the header).
#include "handoff/ipc_server.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.hpp"
#include "handoff/trust.hpp"
#include "observe/log.hpp"
#include "peers/messages.hpp"

namespace tagmem::handoff {
namespace {

void note(const std::string& line) noexcept {
  if (logging(log_level::info)) log_line("ipc " + line);
}

ipc_secret random_secret() {
  ipc_secret s{};
  std::size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = ::getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    TAGMEM_EXPECTS(n > 0, TAGMEM_ERROR_INTERNAL,
                   std::string("getrandom for an IPC secret: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  return s;
}

}  // namespace

peers::rendezvous_paths ipc_point(const std::string& dir, pid_t pid) {
  const std::string base = dir + "/ipc-" + std::to_string(pid);
  peers::rendezvous_paths p{base + ".sock", base + ".lock"};
  TAGMEM_EXPECTS(p.socket.size() < sizeof(sockaddr_un{}.sun_path), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "the IPC socket path '" + p.socket +
                     "' is too long for a Unix socket; set TAGMEM_PEER_DIR to a shorter directory");
  return p;
}

ipc_server::ipc_server(ipc_source& source, std::string job, const std::string& dir, int timeout_ms)
    : source_(source), job_(std::move(job)), timeout_ms_(timeout_ms) {
  listener_ = std::make_unique<peers::rendezvous_listener>(
      ipc_point(dir, ::getpid()), 64,
      job_.empty() ? std::string("the IPC exports of this process")
                   : "the IPC exports of job '" + job_ + "'");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    fail(TAGMEM_ERROR_PEER, std::string("eventfd for the IPC thread: ") + std::strerror(errno));
  }
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    ::close(wake_fd_);
    fail(TAGMEM_ERROR_PEER, "cannot start the IPC thread");
  }
}

ipc_server::~ipc_server() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  thread_.join();
  ::close(wake_fd_);
}

ipc_handle ipc_server::add(std::uint64_t ptr, std::uint64_t bytes, const gpu_uuid& uuid,
                           std::uint64_t granularity) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(records_.begin(), records_.end(), [&](const record& r) {
    return r.ptr == ptr && r.bytes == bytes && r.uuid == uuid;
  });
  if (it == records_.end()) {
    records_.push_back({next_id_++, ptr, bytes, granularity, random_secret(), uuid});
    it = records_.end() - 1;
    stats_.exports = records_.size();
  }
  return {peers::identity_of(::getpid()), it->id, it->secret, it->uuid};
}

bool ipc_server::remove(std::uint64_t id, const ipc_secret& secret) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(records_.begin(), records_.end(),
                         [&](const record& r) { return r.id == id && r.secret == secret; });
  if (it == records_.end()) return false;
  records_.erase(it);
  stats_.exports = records_.size();
  return true;
}

void ipc_server::forget_within(std::uint64_t base, std::uint64_t size) {
  std::lock_guard lock(mutex_);
  std::erase_if(records_, [&](const record& r) { return r.ptr >= base && r.ptr - base < size; });
  stats_.exports = records_.size();
}

std::vector<ipc_importer> ipc_server::importers() const {
  std::lock_guard lock(mutex_);
  std::vector<ipc_importer> out;
  for (const auto& [key, who] : live_) out.push_back(who);
  return out;
}

ipc_server_counters ipc_server::counters() const {
  std::lock_guard lock(mutex_);
  ipc_server_counters c = stats_;
  c.importers = live_.size();
  return c;
}

void ipc_server::after_end() noexcept {
  try {
    source_.imports_ended(importers());
  } catch (...) {  // no memory for the list: what the source holds waits for the next end
  }
}

void ipc_server::end(std::uint64_t key) noexcept {
  std::lock_guard lock(mutex_);
  std::erase_if(live_, [&](const auto& e) { return e.first == key; });
  live_count_.store(live_.size(), std::memory_order_release);
}

void ipc_server::serve_open(session& s) {
  peers::unix_channel& ch = *s.ch;
  peers::message m = ch.receive(timeout_ms_, "waiting for an importer's request");
  if (m.type != kIpcOpen || !m.fds.empty()) {
    fail(TAGMEM_ERROR_PEER, ch.peer_name() + " opened with something other than a request");
  }
  const ipc_open o =
      peers::decode_from(ch.peer_name(), "request", [&] { return decode_ipc_open(m.payload); });
  const peers::peer_credentials cred = ch.credentials();
  const peers::process_identity live = peers::identity_of(cred.pid);
  std::string why;
  record rec;
  {
    std::lock_guard lock(mutex_);
    auto it = std::find_if(records_.begin(), records_.end(),
                           [&](const record& r) { return r.id == o.id && r.secret == o.secret; });
    if (it == records_.end()) {
      why = "process " + std::to_string(::getpid()) + " has no export " + std::to_string(o.id) +
            " with that secret: it was unexported, its memory freed, or the handle is forged";
    } else {
      rec = *it;
    }
  }
  // Jobs are compared only where both sides have one (Note [ipc without a job] in
  // registry/registry_ipc.cpp): without, the secret, uid and identified pid authorise.
  const std::string job = job_.empty() || o.from.job.empty() ? o.from.job : job_;
  if (why.empty())
    why = mismatch({job, rec.uuid, rec.granularity, ::geteuid()}, cred, live, o.from);
  tagmem_status status = TAGMEM_ERROR_PEER;
  peers::owned_fds fds;
  ipc_mapped mapped;
  if (why.empty()) {
    try {
      mapped = source_.export_parts(rec.ptr, rec.bytes, fds, [&] {
        std::lock_guard lock(mutex_);
        live_.push_back({s.key, {o.from.who, rec.ptr, rec.bytes}});
        live_count_.store(live_.size(), std::memory_order_release);
      });
    } catch (const error& e) {
      end(s.key);
      status = e.code();
      why = e.what();
    }
  }
  if (!why.empty()) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.refused;
    }
    note("refuse " + why);
    ch.send(kIpcRefuse, encode_refuse({status, why}), {}, timeout_ms_, "refusing an importer");
    fail(TAGMEM_ERROR_PEER, "refused");  // ends the session
  }
  ch.send(kIpcMapped, encode_ipc_mapped(mapped), fds.view(), timeout_ms_, "sending the handles");
  {
    std::lock_guard lock(mutex_);
    ++stats_.opened;
  }
  note("opened id=" + std::to_string(rec.id) + " bytes=" + std::to_string(rec.bytes) +
       " by=" + o.from.who.describe());
}

void ipc_server::run() noexcept {
  std::vector<session> sessions;  // live imports, each waiting for its CLOSE or its end
  std::uint64_t next_key = 1;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stop_) break;
    }
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {listener_->fd(), POLLIN, 0}};
    for (const session& s : sessions) fds.push_back({s.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      std::uint64_t n = 0;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_, &n, sizeof n);
    }
    // Live imports first: whatever arrives (CLOSE) or a hang-up ends them.
    bool ended = false;
    for (std::size_t i = sessions.size(); i-- > 0;) {
      if (fds[2 + i].revents == 0) continue;
      end(sessions[i].key);
      sessions.erase(sessions.begin() + static_cast<std::ptrdiff_t>(i));
      ended = true;
    }
    if (ended) after_end();
    if (fds[1].revents & POLLIN) {
      const int c = ::accept4(listener_->fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) continue;
      session s{std::make_unique<peers::unix_channel>(c, "IPC importer"), c, next_key++};
      try {
        s.ch->set_peer_name("IPC importer pid " + std::to_string(s.ch->credentials().pid));
        serve_open(s);
        sessions.push_back(std::move(s));
      } catch (const std::exception& e) {
        end(s.key);
        note(std::string("session-ended reason=\"") + e.what() + "\"");
        after_end();  // it may have been live for a moment
      }
    }
  }
  for (const session& s : sessions) end(s.key);
}

}  // namespace tagmem::handoff
