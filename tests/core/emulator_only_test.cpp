// emulator_only_test.cpp — what only the emulated driver can show: offloaded memory faults when
// touched from the host, process RSS falls after an offload, and injected driver failures
// lose nothing. Excluded from the GPU run by suite name (Emulator*).
#include <sys/mman.h>

#include <cstring>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class EmulatorOnly : public tagmem_test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    tagmem_test::SetUp();
  }
};
using EmulatorOnlyDeathTest = EmulatorOnly;

TEST_F(EmulatorOnlyDeathTest, TouchingOffloadedMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 1 << 20, "touch", 0, nullptr));
  // Emulated device memory is host memory: resident, it reads and writes like any other.
  std::memset(p, 0x5a, 1 << 20);
  EXPECT_EQ(static_cast<unsigned char*>(p)[12345], 0x5a);
  const char* tags[] = {"touch"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  EXPECT_DEATH({ static_cast<volatile unsigned char*>(p)[100] = 1; }, "");
  EXPECT_DEATH({ (void)static_cast<volatile unsigned char*>(p)[200]; }, "");
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(static_cast<unsigned char*>(p)[12345], 0x5a);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(EmulatorOnly, ProcessMemoryFallsAfterOffloadAndReturnsAfterReload) {
  auto rng = rng_for_test();
  const std::size_t n = 256 << 20;
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, n, "rss", 0, nullptr));
  auto bytes = random_bytes(rng, n);
  write_device(p, bytes.data(), n);
  // A pinned store big enough in advance, so the offload itself adds no host memory.
  TAGMEM_OK(tagmem_host_reserve(n + (4u << 20), 1));
  const char* tags[] = {"rss"};
  std::size_t rss_resident = rss_bytes();
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
  TAGMEM_OK(tagmem_wait_released(0));  // DISCARD releases in the background
  std::size_t rss_offloaded = rss_bytes();
  EXPECT_LT(rss_offloaded + (200u << 20), rss_resident)
      << "discarding 256 MiB should give it back to the OS";
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  write_device(p, bytes.data(), n);
  EXPECT_EQ(read_device(p, n), bytes);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

// The emulator has two devices: a push creates its tag on the pushing thread's current device
// only.
TEST_F(EmulatorOnly, PushCreatesTheTagOnTheCurrentDeviceOnly) {
  const auto& api = driver_api_for_tests();
  CUdevice one = 0;
  CUcontext ctx1 = nullptr, before = nullptr;
  ASSERT_EQ(api.cuDeviceGet(&one, 1), CUDA_SUCCESS) << "the emulator should have two devices";
  ASSERT_EQ(api.cuDevicePrimaryCtxRetain(&ctx1, one), CUDA_SUCCESS);
  ASSERT_EQ(api.cuCtxGetCurrent(&before), CUDA_SUCCESS);
  ASSERT_EQ(api.cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
  tagmem_status pushed = tagmem_push_tag("on_one");
  ASSERT_EQ(api.cuCtxSetCurrent(before), CUDA_SUCCESS);
  TAGMEM_OK(pushed);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("on_one", 1, &s));
  EXPECT_EQ(s.live_allocations, 0u);
  TAGMEM_FAILS_WITH(tagmem_tag_stats_get("on_one", 0, &s), TAGMEM_ERROR_UNKNOWN_TAG);
  TAGMEM_OK(tagmem_pop_tag());
  ASSERT_EQ(api.cuDevicePrimaryCtxRelease(one), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tagmem::test
