// way_words.hpp — words of pinned host memory that a device's copy streams wait on
// (cuStreamWaitValue32), lent one at a time to an offload that holds its copies back while
// another process of the job copies a reload (Note [copies give way] in offload/give_way.hpp).
//
// A word is 0 (open: a stream waiting on it goes on) or 1 (closed). One page holds them all,
// allocated at the first loan and freed with the device: cuMemFreeHost waits for every device's
// work, which an offload's end must not do. With unified addressing the page's host address is
// its device address too. A borrower opens its word before giving it back, so no wait queued on
// it is left closed.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace tagmem {

class way_words {
 public:
  way_words() = default;
  ~way_words() = default;
  way_words(const way_words&) = delete;
  way_words& operator=(const way_words&) = delete;

  // An open word, or null when every word is lent or no pinned page can be had (the caller then
  // holds nothing back). Call with the device's context current.
  std::uint32_t* lend() noexcept;
  void give_back(std::uint32_t* word) noexcept;  // opens it first

  static void set(std::uint32_t* word, bool closed) noexcept {
    std::atomic_ref<std::uint32_t>(*word).store(closed ? 1u : 0u, std::memory_order_release);
  }
  static CUdeviceptr address(const std::uint32_t* word) noexcept {
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(word));
  }

  // Frees the page; the device calls it with its context current and its streams idle.
  void free_page() noexcept;

  static constexpr int count = 64;

 private:
  std::mutex mutex_;
  std::uint32_t* page_ = nullptr;
  std::uint64_t lent_ = 0;  // bit i: word i is lent
  bool failed_ = false;     // the page could not be had; not tried again
};

}  // namespace tagmem
