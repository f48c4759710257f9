// service.cpp — one device's handoff: the taker thread, the announcements, the offload seams
// (Note [handoff] in service.hpp).
#include "handoff/service.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.hpp"
#include "device/device.hpp"
#include "handoff/handoff_point.hpp"
#include "handoff/taker.hpp"
#include "observe/log.hpp"

namespace tagmem::handoff {
namespace {

identity make_identity(device& dev, const config& cfg, const std::string& job,
                       const std::string& dir) {
  identity id;
  id.dir = dir;
  id.me.job = job;
  std::memcpy(id.me.uuid.data(), dev.uuid().bytes, id.me.uuid.size());
  id.me.granularity = dev.granularity();
  id.me.uid = ::geteuid();
  id.mine = {job, id.me.uuid, id.me.granularity, peers::identity_of(::getpid())};
  id.timeout_ms = cfg.handoff_timeout_ms;
  id.hold_ms = cfg.handoff_hold_ms;
  id.default_largest = std::max(cfg.max_mapping_bytes, cfg.discard_mapping_bytes);
  return id;
}

}  // namespace

service::service(device& dev, const config& cfg, const std::string& job, const std::string& dir)
    : dev_(dev),
      id_(make_identity(dev, cfg, job, dir)),
      gate_(dir, job, id_.me.uuid),
      book_(cfg.handoff_after_offload, id_.default_largest),
      inbox_(dev, stats_),
      outbox_(dev, id_, stats_) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    fail(TAGMEM_ERROR_PEER, std::string("eventfd for the handoff thread: ") + std::strerror(errno));
  }
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    ::close(wake_fd_);
    fail(TAGMEM_ERROR_DRIVER, "cannot start the handoff thread");
  }
  dev_.releases().set_gate(&gate_, std::chrono::milliseconds(id_.timeout_ms));
}

service::~service() {
  dev_.releases().set_gate(nullptr, std::chrono::milliseconds(0));
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake();
  thread_.join();
  listener_.reset();
  ::close(wake_fd_);
}

void service::wake() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

bool service::listening() const noexcept {
  std::lock_guard lock(mutex_);
  return listen_ && listener_ != nullptr;
}

void service::follow(bool announcing) noexcept {
  {
    std::lock_guard lock(mutex_);
    listen_ = announcing;
    if (announcing && !listener_) {
      try {
        listener_ = std::make_unique<peers::rendezvous_listener>(
            own_point(id_.dir, id_.me.job, id_.me.uuid), 16, "handoff of job '" + id_.me.job + "'");
      } catch (const std::exception& e) {
        if (logging(log_level::info))
          log_line(std::string("handoff cannot-listen reason=\"") + e.what() + "\"");
      }
    }
  }
  if (!announcing) inbox_.release_larger_than(0);  // nothing is taken any more
  wake();
}

void service::expect(std::size_t bytes) {
  follow(book_.expect(bytes, inbox_.bytes()));
  TAGMEM_EXPECTS(listening(), TAGMEM_ERROR_PEER,
                 "cannot listen for the job's processes in '" + id_.dir +
                     "' (TAGMEM_LOG=info "
                     "says why)");
}

void service::cancel() noexcept { follow(book_.cancel(inbox_.bytes())); }

void service::offloaded(std::size_t bytes, std::size_t largest_span) noexcept {
  follow(book_.offloaded(bytes, largest_span, inbox_.bytes()));
}

void service::attach_for_test(int fd, bool giver) {
  auto ch = std::make_unique<peers::unix_channel>(fd, "handoff test peer");
  if (giver) {
    outbox_.attach(std::move(ch));
    return;
  }
  {
    std::lock_guard lock(mutex_);
    attached_ = std::move(ch);
  }
  wake();
}

physical_sink* service::do_sink_for_offload(std::size_t out_bytes, std::size_t) noexcept {
  std::lock_guard lock(offload_mutex_);
  if (offloads_ == 0 && !outbox_.open(out_bytes)) return nullptr;
  ++offloads_;
  return &outbox_;
}

void service::do_offload_done() noexcept {
  std::lock_guard lock(offload_mutex_);
  if (--offloads_ == 0) outbox_.close_all();
}

void service::do_reloading(std::size_t wanted, std::size_t largest_run) noexcept {
  follow(book_.reloading(wanted, largest_run, inbox_.bytes()));
}

void service::do_copying(bool on) noexcept {
  if (on) {
    gate_.begin();
  } else {
    gate_.end();
  }
}

void service::do_reload_done() noexcept { follow(book_.reload_done(inbox_.bytes())); }

void service::do_release_unfit(std::size_t largest_run) noexcept {
  inbox_.release_larger_than(largest_run);
}

bool service::do_wait_for_more(std::chrono::steady_clock::time_point until,
                               std::uint64_t arrivals_seen) noexcept {
  return inbox_.wait_for_arrival(until, arrivals_seen);
}

void service::do_waited(std::chrono::nanoseconds how_long, bool timed_out) noexcept {
  ++stats_.reload_waits;
  stats_.reload_wait_ns += static_cast<std::uint64_t>(how_long.count());
  if (timed_out) ++stats_.reload_wait_timeouts;
}

void service::run() noexcept {
  using clock = std::chrono::steady_clock;
  const auto hold = std::chrono::milliseconds(id_.hold_ms);
  for (;;) {
    int listen_fd = -1;
    std::unique_ptr<peers::unix_channel> attached;
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      if (!listen_ && listener_) listener_.reset();  // only this thread destroys it
      if (listener_) listen_fd = listener_->fd();
      attached = std::move(attached_);
    }
    if (attached) {
      serve_giver(dev_, id_, book_, inbox_, stats_, *attached, false, coming_);
      continue;
    }
    inbox_.release_older_than(clock::now() - hold);  // TAGMEM_HANDOFF_HOLD_MS
    int timeout_ms = 1000;
    if (const auto oldest = inbox_.oldest(); oldest != clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(oldest + hold - clock::now());
      timeout_ms = static_cast<int>(std::clamp<long long>(left.count() + 1, 1, timeout_ms));
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {listen_fd, POLLIN, 0}};
    if (::poll(fds, listen_fd >= 0 ? 2 : 1, timeout_ms) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      std::uint64_t n = 0;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_, &n, sizeof n);
    }
    if (listen_fd >= 0 && (fds[1].revents & POLLIN)) {
      const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) continue;
      peers::unix_channel ch(c, "handoff giver");
      serve_giver(dev_, id_, book_, inbox_, stats_, ch, true, coming_);
    }
  }
}

}  // namespace tagmem::handoff
