// out_of_memory_test.cpp — a reload that cannot fit fails cleanly and loses nothing.
//
// The device is filled from outside tagmem (cuMemAlloc, as another library in the process would
// do) until an offloaded tag no longer fits. The reload must fail with OUT_OF_MEMORY, change
// nothing (the tag stays offloaded with its backup, no device memory is taken) and fail the same
// way when tried again; once the filler is freed, the reload must succeed with every byte at its
// old address. The same for a swap: its offload part happens, its reload part fails and is
// retried. On a GPU this is the real out-of-memory of the driver (tests/stress/gpu_run.sh); on
// the emulator the device is shrunk to 512 MiB so the filler stays small.
//
// Knob: TAGMEM_OOM_MIB, the size of the tag that cannot come back (64).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "emu_controls.hpp"
#include "stress_support.hpp"

namespace tagmem::stress {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class OutOfMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& emu = reliability::emu();
    if (emu.available) {
      saved_bytes_ = emu.device_bytes(0);
      emu.set_device_bytes(0, 512 * kMiB);
    }
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    bind_device0();
  }
  void TearDown() override {
    for (CUdeviceptr p : filler_) driver::api().cuMemFree(p);
    EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
    if (saved_bytes_) reliability::emu().set_device_bytes(0, saved_bytes_);
  }

  static std::size_t free_bytes() {
    tagmem_device_stats s{};
    EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
    return s.device_free_bytes;
  }

  // Takes device memory with cuMemAlloc until at most `leave` bytes are free.
  void fill_until(std::size_t leave) {
    bind_device0();
    std::size_t chunk = std::size_t{1} << 30;
    for (std::size_t free = free_bytes(); free > leave;) {
      std::size_t want = std::min(chunk, free - leave) / (2 * kMiB) * (2 * kMiB);
      want = std::max(want, 2 * kMiB);
      CUdeviceptr p = 0;
      if (driver::api().cuMemAlloc(&p, want) != CUDA_SUCCESS) {
        if (chunk <= 2 * kMiB) break;  // as full as it gets
        chunk /= 2;                    // fragmented: take smaller pieces
        continue;
      }
      filler_.push_back(p);
      free = free_bytes();
    }
  }

  void release_filler() {
    bind_device0();
    for (CUdeviceptr p : filler_) ASSERT_EQ(driver::api().cuMemFree(p), CUDA_SUCCESS);
    filler_.clear();
  }

  struct tensor {
    CUdeviceptr ptr;
    host_buffer bytes;
  };

  // Allocations of mixed sizes adding up to about `total` bytes in `tag`, random contents.
  std::vector<tensor> make_tag(const char* tag, std::size_t total, std::uint64_t seed, copier& io) {
    std::vector<tensor> out;
    const std::size_t sizes[] = {total / 2 + 12345, total / 4 + 777, total / 8, 4096, 300000};
    for (std::size_t size : sizes) {
      void* p = nullptr;
      EXPECT_EQ(tagmem_malloc_tagged(&p, size, tag, 0, nullptr), TAGMEM_SUCCESS)
          << tagmem_last_error();
      tensor t{reinterpret_cast<CUdeviceptr>(p), host_buffer(size)};
      seed = fill_random(t.bytes.data(), size, seed);
      io.write(t.ptr, t.bytes.data(), size);
      out.push_back(std::move(t));
    }
    return out;
  }

  void expect_intact(const std::vector<tensor>& tensors, const char* tag, copier& io) {
    for (const tensor& t : tensors) {
      EXPECT_EQ(io.compare(t.ptr, t.bytes.data(), t.bytes.size()), t.bytes.size())
          << "an allocation of " << tag << " lost its bytes";
      void* base = nullptr;
      EXPECT_EQ(
          tagmem_pointer_info(reinterpret_cast<void*>(t.ptr), nullptr, 0, nullptr, &base, nullptr),
          TAGMEM_SUCCESS);
      EXPECT_EQ(reinterpret_cast<CUdeviceptr>(base), t.ptr);
      bytes_verified_ += t.bytes.size();
    }
  }

  static tagmem_tag_stats stats(const char* tag) {
    tagmem_tag_stats s{};
    EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
    return s;
  }

  // How far free memory may move without tagmem doing anything: the real driver's own small
  // allocations (streams, events) take up to 2 MiB.
  static std::size_t noise() { return using_emulator() ? 0 : 2 * kMiB; }

  std::vector<CUdeviceptr> filler_;
  std::uint64_t saved_bytes_ = 0;
  std::uint64_t bytes_verified_ = 0;
};

TEST_F(OutOfMemory, ReloadThatCannotFitFailsCleanlyAndSucceedsOnceMemoryIsFreed) {
  copier io;
  const std::size_t n = knob("TAGMEM_OOM_MIB", 64) * kMiB;
  auto victim = make_tag("victim", n, 1, io);
  const char* tags[] = {"victim"};
  const tagmem_tag_stats resident = stats("victim");
  ASSERT_EQ(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  const tagmem_tag_stats offloaded = stats("victim");
  ASSERT_EQ(offloaded.host_bytes, resident.mapped_bytes);

  fill_until(resident.mapped_bytes / 2);
  const std::size_t free_full = free_bytes();
  ASSERT_LT(free_full, resident.mapped_bytes) << "could not fill the device";
  std::printf("[oom] tag of %zu MiB offloaded; device filled to %zu MiB free by %zu cuMemAlloc\n",
              resident.mapped_bytes >> 20, free_full >> 20, filler_.size());

  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_EQ(tagmem_reload(tags, 1, 0), TAGMEM_ERROR_OUT_OF_MEMORY);
    EXPECT_STRNE(tagmem_last_error(), "");
    const tagmem_tag_stats still = stats("victim");
    EXPECT_EQ(still.state, TAGMEM_OFFLOADED_BACKUP);
    EXPECT_EQ(still.host_bytes, offloaded.host_bytes);
    EXPECT_EQ(still.mapped_bytes, 0u);
    EXPECT_EQ(still.reload_count, offloaded.reload_count);
    EXPECT_NEAR(double(free_bytes()), double(free_full), double(noise()))
        << "the failed reload kept device memory";
  }

  release_filler();
  ASSERT_EQ(tagmem_reload(tags, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(stats("victim").mapped_bytes, resident.mapped_bytes);
  expect_intact(victim, "victim", io);
  for (tensor& t : victim) EXPECT_EQ(tagmem_free(reinterpret_cast<void*>(t.ptr), nullptr), 0);
  std::printf("[oom] reload refused twice, then restored %llu bytes intact\n",
              static_cast<unsigned long long>(bytes_verified_));
}

TEST_F(OutOfMemory, SwapWhoseReloadCannotFitOffloadsAndKeepsTheBackup) {
  copier io;
  const std::size_t n = knob("TAGMEM_OOM_MIB", 64) * kMiB;
  auto small = make_tag("small", n / 4, 2, io);
  auto big = make_tag("big", n, 3, io);
  const char* small_tag[] = {"small"};
  const char* big_tag[] = {"big"};
  const tagmem_tag_stats small_resident = stats("small");
  const tagmem_tag_stats big_resident = stats("big");
  ASSERT_EQ(tagmem_offload(big_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();

  // Even with `small` gone, `big` does not fit.
  fill_until((big_resident.mapped_bytes - small_resident.mapped_bytes) / 4);
  ASSERT_LT(free_bytes() + small_resident.mapped_bytes, big_resident.mapped_bytes);

  EXPECT_EQ(tagmem_swap(small_tag, 1, big_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_STRNE(tagmem_last_error(), "");
  EXPECT_EQ(stats("small").state, TAGMEM_OFFLOADED_BACKUP) << "the offload part must happen";
  EXPECT_EQ(stats("big").state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(stats("big").host_bytes, big_resident.mapped_bytes);
  EXPECT_EQ(stats("big").mapped_bytes, 0u);

  release_filler();
  const char* both[] = {"big", "small"};
  ASSERT_EQ(tagmem_reload(both, 2, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  expect_intact(big, "big", io);
  expect_intact(small, "small", io);
  for (auto* list : {&small, &big}) {
    for (tensor& t : *list) EXPECT_EQ(tagmem_free(reinterpret_cast<void*>(t.ptr), nullptr), 0);
  }
}

}  // namespace
}  // namespace tagmem::stress
