// background_pinning.cpp — the pin-ahead thread (Note [pin ahead] in background_pinning.hpp).
#include "host/background_pinning.hpp"

#include <algorithm>
#include <atomic>
#include <utility>

#include "host/host_store.hpp"

namespace tagmem {
namespace {

std::atomic<background_pinning*> g_pinner{nullptr};

}  // namespace

background_pinning::background_pinning(store_access store, planned_bytes planned)
    : store_(std::move(store)), planned_(std::move(planned)) {
  g_pinner.store(this);
}

background_pinning::~background_pinning() {
  background_pinning* self = this;
  g_pinner.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void background_pinning::wake() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    dirty_ = true;
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { loop(); });
      } catch (...) {
        dirty_ = false;
        return;
      }
    }
  }
  changed_.notify_all();
}

void background_pinning::wait_idle() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return stop_ || (!dirty_ && !busy_); });
  }
  store_().reserve(0, host_store::growth::now);  // waits for the store's background growth
}

void background_pinning::loop() noexcept {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || dirty_; });
    if (stop_) break;
    dirty_ = false;
    busy_ = true;
    lock.unlock();
    pin_to_target();
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
  busy_ = false;
  dirty_ = false;
  changed_.notify_all();
}

void background_pinning::pin_to_target() noexcept {
  try {
    const std::size_t planned = planned_();
    host_store& store = store_();
    const host_store_stats s = store.stats();
    const std::size_t target = std::min(s.used_bytes + planned, s.budget_bytes);
    // The store's own background growth, which an offload that needs it waits for rather than
    // pinning the same bytes a second time.
    if (target > s.pinned_bytes) store.reserve(target, host_store::growth::in_background);
  } catch (...) {  // dropped: the offload pins what is missing and reports its own failure
  }
}

void note_backup_growth() noexcept {
  if (background_pinning* p = g_pinner.load()) p->wake();
}

void wait_for_background_pinning() {
  if (background_pinning* p = g_pinner.load()) p->wait_idle();
}

}  // namespace tagmem
