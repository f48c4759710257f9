// way_words.cpp — see way_words.hpp.
#include "device/way_words.hpp"

#include "driver/driver.hpp"
#include "observe/log.hpp"

namespace tagmem {

void way_words::free_page() noexcept {
  std::lock_guard lock(mutex_);
  if (page_) driver::api().cuMemFreeHost(page_);
  page_ = nullptr;
  lent_ = 0;
}

std::uint32_t* way_words::lend() noexcept {
  std::lock_guard lock(mutex_);
  if (!page_ && !failed_) {
    void* p = nullptr;
    const CUresult r = driver::api().cuMemHostAlloc(
        &p, count * sizeof(std::uint32_t), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r != CUDA_SUCCESS || p == nullptr) {
      failed_ = true;
      if (logging(log_level::info)) {
        log_line("give-way no-pinned-word result=" + std::to_string(static_cast<int>(r)));
      }
      return nullptr;
    }
    page_ = static_cast<std::uint32_t*>(p);
    for (int i = 0; i < count; ++i) set(page_ + i, false);
  }
  if (!page_) return nullptr;
  for (int i = 0; i < count; ++i) {
    if ((lent_ & (std::uint64_t{1} << i)) == 0) {
      lent_ |= std::uint64_t{1} << i;
      return page_ + i;
    }
  }
  return nullptr;
}

void way_words::give_back(std::uint32_t* word) noexcept {
  if (!word) return;
  set(word, false);
  std::lock_guard lock(mutex_);
  lent_ &= ~(std::uint64_t{1} << (word - page_));
}

}  // namespace tagmem
