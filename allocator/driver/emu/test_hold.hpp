// test_hold.hpp — a one-shot hold for tests: arm() makes the next operation that takes() it wait
// in wait() until release() (tagmem_emu_hold_next_h2d_copy, tagmem_emu_hold_next_map).
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace tagmem::emu {

class test_hold {
 public:
  void arm() {
    {
      std::lock_guard lock(mutex_);
      open_ = false;
    }
    armed_ = true;
  }
  // Whether the calling operation is the one held (at most one per arm()).
  bool take() { return armed_.exchange(false); }
  void wait() {
    std::unique_lock lock(mutex_);
    opened_.wait(lock, [this] { return open_; });
  }
  void release() {
    armed_ = false;
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  std::atomic<bool> armed_{false};
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = true;
};

}  // namespace tagmem::emu
