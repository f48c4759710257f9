// release_queue.cpp — the background release thread (Note [background release]).
#include "device/release_queue.hpp"

#include <algorithm>
#include <array>

#include "base/error.hpp"
#include "device/release_clock.hpp"
#include "driver/driver.hpp"
#include "observe/trace.hpp"

namespace tagmem {

release_queue::~release_queue() {
  drain();
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void release_queue::push(CUmemGenericAllocationHandle handle, std::size_t bytes) {
  std::unique_lock lock(mutex_);
  // Room for the record in every list it may reach first, so that nothing can fail once it is
  // queued (unhold() moves later_ into queued_, the thread and drain() move records into failed_,
  // none of them allocating).
  const std::size_t records = queued_.size() + later_.size() + 1;
  queued_.reserve(records);
  later_.reserve(later_.size() + 1);
  failed_.reserve(failed_.size() + in_flight_ + records);
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { work(); });
    } catch (const std::exception& ex) {
      fail(TAGMEM_ERROR_DRIVER, std::string("cannot start the release thread: ") + ex.what());
    }
  }
  (holds_ == 0 ? queued_ : later_).push_back({handle, bytes});
  pending_bytes_ += bytes;
  lock.unlock();
  changed_.notify_all();
}

void release_queue::work() noexcept {
  std::unique_lock lock(mutex_);
  meta_vector<item> batch;
  for (;;) {
    // What a hold holds back is in later_, not here (Note [background release]).
    changed_.wait(lock, [&] { return stop_ || !queued_.empty(); });
    if (queued_.empty()) return;  // stop_ and nothing left
    const bool bound_ran_out = wait_while_copies_run(lock, true);
    if (queued_.empty()) continue;  // a drain took them
    // Note [releases wait for copies]: bytes_per_ask at a time while the gate is asked (here,
    // not in a vector: the thread allocates nothing).
    std::array<item, handles_per_ask> hand{};
    item* first = hand.data();
    item* last = first;
    if (gate_ && !bound_ran_out) {
      std::size_t bytes = 0;
      while (!queued_.empty() && last != first + hand.size() &&
             (last == first || bytes < bytes_per_ask)) {
        bytes += queued_.back().bytes;
        *last++ = queued_.back();
        queued_.pop_back();
      }
    } else {
      batch.swap(queued_);
      first = batch.data();
      last = first + batch.size();
    }
    in_flight_ = static_cast<std::size_t>(last - first);
    lock.unlock();
    std::size_t released = 0;
    item* const failed_end = release_all(first, last, released);
    lock.lock();
    failed_.insert(failed_.end(), first, failed_end);  // within what push() reserved
    pending_bytes_ -= released;
    batch.clear();
    in_flight_ = 0;
    changed_.notify_all();
  }
}

bool release_queue::wait_while_copies_run(std::unique_lock<std::mutex>& lock,
                                          bool thread) noexcept {
  if (!gate_ || (thread && stop_) || !gate_->copies_running()) return false;
  trace::span span("release_wait");
  const auto until = std::chrono::steady_clock::now() + gate_bound_;
  do {
    // Woken early by a push, a drain or the destructor; else polled.
    changed_.wait_until(
        lock, std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(2)));
  } while (gate_ && std::chrono::steady_clock::now() < until &&
           !(thread && (stop_ || queued_.empty())) && gate_->copies_running());
  return std::chrono::steady_clock::now() >= until;
}

release_queue::item* release_queue::release_all(item* first, item* last,
                                                std::size_t& released) noexcept {
  trace::span span("release");
  return std::remove_if(first, last, [&](const item& it) {  // the failures stay, at the front
    if (release_clock::release(it.handle, it.bytes) != CUDA_SUCCESS) return false;
    released += it.bytes;
    return true;
  });
}

CUresult release_queue::drain() noexcept {
  std::unique_lock lock(mutex_);
  // What is queued is released here rather than waited for (it may be held back).
  failed_.insert(failed_.end(), queued_.begin(), queued_.end());  // within push()'s reserve
  failed_.insert(failed_.end(), later_.begin(), later_.end());
  queued_.clear();
  later_.clear();
  changed_.wait(lock, [&] { return in_flight_ == 0; });
  CUresult first = CUDA_SUCCESS;
  std::erase_if(failed_, [&](const item& it) {
    // Twice, so that a transient failure costs the same whichever thread met it first.
    CUresult r = release_clock::release(it.handle, it.bytes);
    if (r != CUDA_SUCCESS) r = release_clock::release(it.handle, it.bytes);
    if (r != CUDA_SUCCESS) {
      if (first == CUDA_SUCCESS) first = r;
      return false;
    }
    pending_bytes_ -= it.bytes;
    return true;
  });
  return first;
}

void release_queue::hold() noexcept {
  std::lock_guard lock(mutex_);
  ++holds_;
}

void release_queue::unhold() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (--holds_ == 0) {  // what the holds held back joins the queue
      queued_.insert(queued_.end(), later_.begin(), later_.end());  // within push()'s reserve
      later_.clear();
    }
  }
  changed_.notify_all();
}

void release_queue::set_gate(release_gate* gate, std::chrono::milliseconds bound) noexcept {
  {
    std::lock_guard lock(mutex_);
    gate_ = gate;
    gate_bound_ = bound;
  }
  changed_.notify_all();
}

bool release_queue::copies_running() noexcept {
  std::lock_guard lock(mutex_);
  return gate_ && gate_->copies_running();
}

void release_queue::wait_for_copies() noexcept {
  std::unique_lock lock(mutex_);
  wait_while_copies_run(lock, false);
}

std::size_t release_queue::pending_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return pending_bytes_;
}

}  // namespace tagmem
