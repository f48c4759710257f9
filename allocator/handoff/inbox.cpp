// inbox.cpp — received handles held for a reload (see header).
#include "handoff/inbox.hpp"

#include <unistd.h>

#include <iterator>

#include "device/device.hpp"
#include "device/received_fds.hpp"
#include "driver/driver.hpp"

namespace tagmem::handoff {

inbox::~inbox() {
  release_if([](std::size_t, const item&) { return true; });
}

bool inbox::put(physical_part p, int fd) noexcept {
  if (fd >= 0 && !received_fds::keep(p.handle, fd)) ::close(fd);  // it cannot be handed on
  if (!do_put_back(p)) {
    received_fds::forget(p.handle);
    return false;
  }
  {
    std::lock_guard lock(mutex_);
    ++arrivals_;
  }
  arrived_.notify_all();
  if (const arrival_observer* o = observer_.load()) o->fn(p.handle, o->arg);
  return true;
}

template <class Pred>
void inbox::release_if(Pred pred) noexcept {
  held_map out;
  {
    std::lock_guard lock(mutex_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (!pred(it->first, it->second)) {
        ++it;
        continue;
      }
      bytes_ -= it->first;
      stats_.returned_bytes += it->first;  // with bytes_, so that held + returned never dip
      auto next = std::next(it);
      out.insert(held_.extract(it));  // a node move: cannot fail
      it = next;
    }
  }
  release_all(out);
}

void inbox::release_all(held_map& out) noexcept {
  for (auto& [size, i] : out) {
    try {
      dev_.releases().push(i.handle, size);
      continue;
    } catch (...) {  // the thread cannot take it: release it here
    }
    received_fds::release_handle(i.handle);
  }
}

void inbox::release_older_than(clock::time_point cutoff) noexcept {
  release_if([&](std::size_t, const item& i) { return i.arrived < cutoff; });
}

void inbox::release_larger_than(std::size_t largest) noexcept {
  release_if([&](std::size_t size, const item&) { return largest == 0 || size > largest; });
}

inbox::clock::time_point inbox::oldest() const noexcept {
  std::lock_guard lock(mutex_);
  clock::time_point t = clock::time_point::max();
  for (const auto& [size, i] : held_) t = std::min(t, i.arrived);
  return t;
}

bool inbox::wait_for_arrival(clock::time_point until, std::uint64_t seen) noexcept {
  std::unique_lock lock(mutex_);
  return arrived_.wait_until(lock, until, [&] { return arrivals_ != seen; });
}

std::uint64_t inbox::do_arrivals() const noexcept {
  std::lock_guard lock(mutex_);
  return arrivals_;
}

void inbox::do_take_up_to(std::size_t bytes, meta_vector<physical_part>& out) {
  std::lock_guard lock(mutex_);
  if (held_.empty()) return;
  out.reserve(out.size() + std::min(held_.size(), bytes / (2u << 20) + 1));
  std::size_t left = bytes;
  while (left != 0 && out.size() < out.capacity()) {
    auto it = held_.upper_bound(left);  // the largest handle that fits in what is left
    if (it == held_.begin()) break;
    --it;
    out.push_back({it->second.handle, it->first});  // within the room reserved above
    left -= it->first;
    bytes_ -= it->first;
    held_.erase(it);
  }
}

// What do_take_up_to takes, without taking it: its repeated "largest that fits in what is left"
// is one pass from the largest down, since a handle too large for what is left stays too large.
std::size_t inbox::do_would_take(std::size_t bytes) const noexcept {
  std::lock_guard lock(mutex_);
  std::size_t left = bytes;
  for (auto it = held_.rbegin(); it != held_.rend() && left != 0; ++it) {
    if (it->first <= left) left -= it->first;
  }
  return bytes - left;
}

// Not an arrival: a reload waiting for more must not wake for what it gave back itself.
bool inbox::do_put_back(const physical_part& p) noexcept {
  std::lock_guard lock(mutex_);
  try {
    held_.emplace(p.size, item{p.handle, clock::now()});
  } catch (...) {
    return false;
  }
  bytes_ += p.size;
  return true;
}

void inbox::do_mapped(std::size_t bytes) noexcept { stats_.mapped_received_bytes += bytes; }

// A handle that arrived during the caller's try, or one of `bytes` or less (the try would have
// taken it had it been held: another reload's try put it back, which is no arrival), is the next
// try's, not the driver's: sent there, the run would create its memory anew from it, and the
// giver's memory would go back and come out again.
bool inbox::do_release_one(std::size_t bytes, std::uint64_t arrivals_seen) noexcept {
  held_map out;
  {
    std::lock_guard lock(mutex_);
    if (held_.empty() || arrivals_ != arrivals_seen || held_.begin()->first <= bytes) return false;
    auto it = held_.begin();  // the smallest, larger than `bytes`
    bytes_ -= it->first;
    stats_.returned_bytes += it->first;
    out.insert(held_.extract(it));  // a node move: cannot fail
  }
  release_all(out);
  return true;
}

std::size_t inbox::do_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return bytes_;
}

std::size_t inbox::do_largest() const noexcept {
  std::lock_guard lock(mutex_);
  return held_.empty() ? 0 : std::prev(held_.end())->first;
}

}  // namespace tagmem::handoff
