// devices_test.cpp — initialisation, devices, attributes, error names and device accounting.
#include <cstdlib>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using devices = emu_test;

// What a process can do before cuInit: true when every answer is the real driver's.
bool answers_before_init() {
  int count = -1;
  int version = 0;
  CUdeviceptr p = 0;
  const char* name = nullptr;
  return cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED &&
         cuMemAddressReserve(&p, granule, 0, 0, 0) == CUDA_ERROR_NOT_INITIALIZED &&
         cuDriverGetVersion(&version) == CUDA_SUCCESS && version == 13000 &&
         cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name) == CUDA_SUCCESS &&
         cuInit(1) == CUDA_ERROR_INVALID_VALUE && cuInit(0) == CUDA_SUCCESS &&
         cuDeviceGetCount(&count) == CUDA_SUCCESS;
}

// Runs in a fresh process (a death test's child), where cuInit has not been called yet.
TEST(devices_before_init, OnlyInitVersionAndErrorNamesWorkBeforeCuInit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(answers_before_init() ? 0 : 1), ::testing::ExitedWithCode(0), "");
}

// With TAGMEM_EMU_CONTEXT_BYTES set (read once, so in a fresh process): an active primary
// context takes that much of its device, as the real driver's does.
bool contexts_take_their_footprint() {
  ::setenv("TAGMEM_EMU_CONTEXT_BYTES", "512M", 1);
  ::setenv("TAGMEM_EMU_DEVICE_BYTES", "1G", 1);
  CUcontext ctx = nullptr;
  size_t free = 0, total = 0;
  const bool active =
      cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
      cuCtxSetCurrent(ctx) == CUDA_SUCCESS && cuMemGetInfo(&free, &total) == CUDA_SUCCESS &&
      total == (size_t{1} << 30) && free == (size_t{512} << 20);
  const bool released =
      cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS && tagmem_emu_device_used_bytes(0) == 0;
  tagmem_emu_set_device_bytes(1, size_t{256} << 20);  // too small for a context
  return active && released && cuDevicePrimaryCtxRetain(&ctx, 1) == CUDA_ERROR_OUT_OF_MEMORY;
}

TEST(devices_configured, ContextsTakeDeviceMemoryWhenConfiguredTo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(contexts_take_their_footprint() ? 0 : 1), ::testing::ExitedWithCode(0),
              "");
}

TEST_F(devices, EnumerationAndAttributes) {
  int count = 0;
  CU_ASSERT(cuDeviceGetCount(&count));
  EXPECT_EQ(count, tagmem_emu_device_count());
  EXPECT_GE(count, 2) << "the default is 2 devices";
  CUdevice device = -1;
  CU_ASSERT(cuDeviceGet(&device, count - 1));
  EXPECT_EQ(device, count - 1);
  EXPECT_EQ(cuDeviceGet(&device, count), CUDA_ERROR_INVALID_DEVICE);
  const std::pair<CUdevice_attribute, int> expected[] = {
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0},
  };
  for (auto [attribute, value] : expected) {
    int got = -1;
    CU_EXPECT(cuDeviceGetAttribute(&got, attribute, 1));
    EXPECT_EQ(got, value) << "attribute " << attribute;
  }
  int got = 0;
  EXPECT_EQ(cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, count),
            CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(devices, EveryReturnedCodeHasANameAndAString) {
  for (CUresult code :
       {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE,
        CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_INVALID_HANDLE,
        CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY, CUDA_ERROR_ILLEGAL_ADDRESS,
        CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED,
        CUDA_ERROR_UNKNOWN}) {
    const char* name = nullptr;
    const char* text = nullptr;
    CU_EXPECT(cuGetErrorName(code, &name));
    CU_EXPECT(cuGetErrorString(code, &text));
    ASSERT_NE(name, nullptr);
    ASSERT_NE(text, nullptr);
    EXPECT_EQ(std::string(name).rfind("CUDA_", 0), 0u) << name;
  }
  EXPECT_STREQ(
      [] {
        const char* name = nullptr;
        cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &name);
        return name;
      }(),
      "CUDA_ERROR_ILLEGAL_ADDRESS");
  const char* name = "unchanged";
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(9999), &name), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(name, nullptr);
}

TEST_F(devices, GranularityIsTwoMiB) {
  CUmemAllocationProp prop = device_prop(0);
  size_t g = 0;
  CU_ASSERT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(g, granule);
  CU_ASSERT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(g, granule);
}

TEST_F(devices, DeviceSizeIsSetAtRunTime) {
  const uint64_t original = tagmem_emu_device_bytes(0);
  ASSERT_EQ(tagmem_emu_set_device_bytes(0, 8 * mib), 0);
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle a = 0, b = 0;
  CU_ASSERT(cuMemCreate(&a, 6 * mib, &prop, 0));
  EXPECT_EQ(cuMemCreate(&b, 4 * mib, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  size_t free = 0, total = 0;
  CU_ASSERT(cuMemGetInfo(&free, &total));
  EXPECT_EQ(total, 8 * mib);
  EXPECT_EQ(free, 2 * mib);
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 6 * mib);
  EXPECT_EQ(tagmem_emu_device_used_bytes(1), 0u);  // other devices are separate
  CU_ASSERT(cuMemCreate(&b, 2 * mib, &prop, 0));
  CU_EXPECT(cuMemRelease(a));
  CU_EXPECT(cuMemRelease(b));
  EXPECT_EQ(tagmem_emu_set_device_bytes(0, original), 0);
  EXPECT_EQ(tagmem_emu_set_device_bytes(99, 1), -1);
  EXPECT_EQ(tagmem_emu_device_bytes(99), 0u);
}

}  // namespace
}  // namespace tagmem::emu::test
