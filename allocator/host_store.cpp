// host_store.cpp — pinned slabs, extents and background pinning (see Note [pin once]).
//
// Pinning is done as: map anonymous memory, touch it from several threads (page faults are the
// CPU-bound part and parallelise), then cuMemHostRegister it (portable, so every device's copies
// use it). DESIGN.md measured registering touched memory at ~12 GB/s against ~1 GB/s for
// cuMemHostAlloc.
#include "host_store.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <vector>

#include "device.hpp"
#include "driver/driver.hpp"

namespace tagmem {
namespace {

constexpr std::size_t kPage = 2u << 20;

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

void touch_parallel(char* base, std::size_t bytes) {
  unsigned n = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::size_t per = round_up((bytes + n - 1) / n, 4096);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n && i * per < bytes; ++i) {
    threads.emplace_back([=] {
      char* p = base + i * per;
      std::size_t len = std::min(per, bytes - i * per);
      for (std::size_t off = 0; off < len; off += 4096) p[off] = 0;
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

host_store::host_store(std::size_t slab_bytes, CUcontext context)
    : slab_bytes_(slab_bytes), context_(context) {}

host_store::~host_store() {
  std::unique_lock lock(mutex_);
  wait_background(lock);
  for (auto& [base, s] : slabs_) unpin(base);
}

char* host_store::pin(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TAGMEM_EXPECTS(p != MAP_FAILED, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "cannot map " + std::to_string(bytes) + " bytes of host memory for the store");
  char* base = static_cast<char*>(p);
  touch_parallel(base, bytes);
  context_guard guard(context_);
  CUresult r = driver::api().cuMemHostRegister(base, bytes, CU_MEMHOSTREGISTER_PORTABLE);
  if (r != CUDA_SUCCESS) {
    munmap(base, bytes);
    fail(r == CUDA_ERROR_OUT_OF_MEMORY ? TAGMEM_ERROR_HOST_OUT_OF_MEMORY : TAGMEM_ERROR_DRIVER,
         "cuMemHostRegister of " + std::to_string(bytes) +
             " bytes for the pinned host store failed: " + driver::describe(r));
  }
  return base;
}

void host_store::unpin(char* p) noexcept {
  auto it = slabs_.find(p);
  if (it == slabs_.end()) return;
  CUcontext previous = nullptr;
  const auto& api = driver::api();
  api.cuCtxGetCurrent(&previous);
  api.cuCtxSetCurrent(context_);
  api.cuMemHostUnregister(p);
  api.cuCtxSetCurrent(previous);
  munmap(p, it->second.size);
}

void host_store::add_slab_locked(char* base, std::size_t size) {
  slabs_.emplace(base, slab{base, size, 0});
  free_.emplace(base, size);
  stats_.pinned_bytes += size;
  stats_.high_water = std::max(stats_.high_water, stats_.pinned_bytes);
}

void host_store::wait_background(std::unique_lock<std::mutex>& lock) {
  background_done_.wait(lock, [&] { return !background_running_; });
  if (background_.joinable()) {
    std::thread t = std::move(background_);
    lock.unlock();
    t.join();
    lock.lock();
  }
}

meta_vector<host_extent> host_store::acquire(std::size_t bytes) {
  std::unique_lock lock(mutex_);
  wait_background(lock);  // a pending reserve() may be about to provide the space
  std::size_t available = 0;
  for (auto& [p, n] : free_) available += n;
  if (available < bytes) {
    std::size_t need = round_up(std::max(bytes - available, slab_bytes_), kPage);
    char* base = pin(need);  // throws with nothing taken
    add_slab_locked(base, need);
  }
  meta_vector<host_extent> out;
  std::size_t left = bytes;
  for (auto it = free_.begin(); left && it != free_.end();) {
    std::size_t take = std::min(left, it->second);
    out.push_back({it->first, take});
    auto slab_it = std::prev(slabs_.upper_bound(it->first));
    slab_it->second.used += take;
    char* start = it->first;
    std::size_t rest = it->second - take;
    it = free_.erase(it);
    if (rest) it = free_.emplace_hint(it, start + take, rest);
    left -= take;
  }
  stats_.used_bytes += bytes;
  return out;
}

void host_store::give_back_locked(char* ptr, std::size_t size) {
  auto slab_it = std::prev(slabs_.upper_bound(ptr));
  slab_it->second.used -= size;
  char* slab_end = slab_it->first + slab_it->second.size;
  auto next = free_.lower_bound(ptr);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == ptr && prev->first >= slab_it->first) {
      ptr = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && ptr + size == next->first && next->first < slab_end) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(ptr, size);
}

void host_store::release(const meta_vector<host_extent>& extents) noexcept {
  std::lock_guard lock(mutex_);
  for (const host_extent& e : extents) {
    give_back_locked(e.ptr, e.size);
    stats_.used_bytes -= e.size;
  }
}

void host_store::reserve(std::size_t bytes, bool wait) {
  std::unique_lock lock(mutex_);
  wait_background(lock);
  if (stats_.pinned_bytes >= bytes) return;
  std::size_t need = round_up(bytes - stats_.pinned_bytes, kPage);
  if (wait) {
    char* base = pin(need);
    add_slab_locked(base, need);
    return;
  }
  background_running_ = true;
  background_ = std::thread([this, need] {
    char* base = nullptr;
    try {
      base = pin(need);
    } catch (...) {
      base = nullptr;  // reported by the next acquire(), which pins what it needs itself
    }
    std::lock_guard lock(mutex_);
    if (base) add_slab_locked(base, need);
    background_running_ = false;
    background_done_.notify_all();
  });
}

void host_store::trim(std::size_t keep_bytes) {
  std::unique_lock lock(mutex_);
  wait_background(lock);
  for (auto it = slabs_.begin(); it != slabs_.end() && stats_.pinned_bytes > keep_bytes;) {
    if (it->second.used) {
      ++it;
      continue;
    }
    char* base = it->first;
    std::size_t size = it->second.size;
    free_.erase(base);  // an unused slab is one free range
    unpin(base);
    stats_.pinned_bytes -= size;
    it = slabs_.erase(it);
  }
}

host_store_stats host_store::stats() {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace tagmem
