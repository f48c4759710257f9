// want_book.cpp — what this process takes from the job's processes (see header).
#include "handoff/want_book.hpp"

#include <time.h>

#include <algorithm>

namespace tagmem::handoff {
namespace {

std::uint64_t boottime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);  // one clock for every process of the machine
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

}  // namespace

bool want_book::retarget_locked(std::uint64_t held) {
  if (reloading_) {
    target_ = reload_want_;
  } else {
    const std::uint64_t expected = expect_bytes_ != 0 ? expect_bytes_ : offloaded_;  // 0: offloaded
    target_ = std::max(expecting_ ? expected : 0, after_offload_ ? offloaded_ : 0);
  }
  received_ = held;
  const bool on = reloading_ || expecting_ || (after_offload_ && offloaded_ != 0);
  if (on && !announcing_) announced_ns_ = boottime_ns();
  announcing_ = on;
  return on;
}

bool want_book::reloading(std::uint64_t wanted, std::uint64_t largest, std::uint64_t held) {
  std::lock_guard lock(mutex_);
  reloading_ = true;
  reload_want_ = wanted;
  reload_largest_ = largest;
  return retarget_locked(held);
}

bool want_book::reload_done(std::uint64_t held) {
  std::lock_guard lock(mutex_);
  reloading_ = false;
  expecting_ = false;  // a reload covers what was expected
  return retarget_locked(held);
}

bool want_book::expect(std::uint64_t bytes, std::uint64_t held) {
  std::lock_guard lock(mutex_);
  expecting_ = true;
  expect_bytes_ = bytes;
  return retarget_locked(held);
}

bool want_book::cancel(std::uint64_t held) {
  std::lock_guard lock(mutex_);
  expecting_ = false;
  return retarget_locked(held);
}

bool want_book::offloaded(std::uint64_t bytes, std::uint64_t largest_span, std::uint64_t held) {
  std::lock_guard lock(mutex_);
  offloaded_ = bytes;
  offloaded_largest_ = largest_span;
  return retarget_locked(held);
}

want_book::view want_book::now_locked() const {
  view v;
  v.announcing = announcing_;
  v.state = reloading_ ? taker_state::reloading : taker_state::expecting;
  v.want = target_ > received_ ? target_ - received_ : 0;
  v.largest = reloading_ ? reload_largest_ : std::max(default_largest_, offloaded_largest_);
  v.announced_ns = announced_ns_;
  return v;
}

want_book::view want_book::now() const {
  std::lock_guard lock(mutex_);
  return now_locked();
}

bool want_book::take(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const view v = now_locked();
  if (!v.announcing || bytes > v.want || bytes > v.largest) return false;
  received_ += bytes;
  return true;
}

void want_book::untake(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  received_ -= std::min(received_, bytes);
}

}  // namespace tagmem::handoff
