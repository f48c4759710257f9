// classic_test.cpp — cuMemAlloc/cuMemFree and the stream-ordered allocator.
#include <cstring>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using classic = emu_test;

TEST_F(classic, AllocCountsCopiesAndFrees) {
  CUdeviceptr p = 0;
  CU_ASSERT(cuMemAlloc(&p, 1000));
  EXPECT_EQ(p % 256, 0u);
  EXPECT_GE(tagmem_emu_device_used_bytes(0), 1000u);
  EXPECT_EQ(tagmem_emu_live_device_allocations(), 1u);
  const auto data = random_bytes(1000, test_seed());
  CU_ASSERT(cuMemcpyHtoD(p, data.data(), data.size()));
  std::vector<unsigned char> back(1000);
  CU_ASSERT(cuMemcpyDtoH(back.data(), p, back.size()));
  EXPECT_EQ(back, data);
  EXPECT_EQ(cuMemFree(p + 16), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT(cuMemFree(p));
  EXPECT_EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuMemFree(0));
  EXPECT_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 0u);
}

TEST_F(classic, AllocBeyondTheDeviceIsOutOfMemory) {
  const uint64_t original = tagmem_emu_device_bytes(0);
  ASSERT_EQ(tagmem_emu_set_device_bytes(0, 4 * mib), 0);
  CUdeviceptr p = 0, q = 0;
  CU_ASSERT(cuMemAlloc(&p, 3 * mib));
  EXPECT_EQ(cuMemAlloc(&q, 2 * mib), CUDA_ERROR_OUT_OF_MEMORY);
  CU_EXPECT(cuMemFree(p));
  CU_EXPECT(cuMemAlloc(&q, 2 * mib));
  CU_EXPECT(cuMemFree(q));
  ASSERT_EQ(tagmem_emu_set_device_bytes(0, original), 0);
}

TEST_F(classic, FreeAsyncCompletesInStreamOrder) {
  tagmem_emu_set_copy_bytes_per_second(8 * mib);
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUmemoryPool pool = nullptr;
  CU_ASSERT(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t keep = 64 * mib;  // keep freed blocks cached across synchronizes
  CU_ASSERT(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));

  CUdeviceptr a = 0;
  CU_ASSERT(cuMemAllocAsync(&a, granule, s));
  CU_ASSERT(cuMemsetD8Async(a, 0x33, granule, s));  // slow: ~250 ms
  CU_ASSERT(cuMemFreeAsync(a, s));
  EXPECT_EQ(cuMemFreeAsync(a, s), CUDA_ERROR_INVALID_VALUE);  // twice
  CUdeviceptr b = 0;
  CU_ASSERT(cuMemAllocAsync(&b, granule, nullptr));
  EXPECT_NE(b, a) << "reused before the stream reached the free";
  CU_ASSERT(cuStreamSynchronize(s));
  CUdeviceptr c = 0;
  CU_ASSERT(cuMemAllocAsync(&c, granule, s));
  EXPECT_EQ(c, a) << "the freed block is cached and reused";
  EXPECT_EQ(*reinterpret_cast<unsigned char*>(c + granule - 1), 0x33);  // the memset ran first
  CU_ASSERT(cuMemFreeAsync(b, nullptr));
  CU_ASSERT(cuMemFreeAsync(c, s));
  CU_EXPECT(cuMemFreeAsync(0, s));
  CU_ASSERT(cuStreamSynchronize(s));
  EXPECT_EQ(tagmem_emu_live_device_allocations(), 0u);
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 2 * granule);  // cached under the threshold

  keep = 0;
  CU_ASSERT(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  CU_ASSERT(cuStreamSynchronize(s));  // synchronizing trims the pool to its threshold
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 0u);
  EXPECT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &keep),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPoolSetAttribute(nullptr, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetDefaultMemPool(&pool, 99), CUDA_ERROR_INVALID_DEVICE);
  CU_EXPECT(cuStreamDestroy(s));
}

}  // namespace
}  // namespace tagmem::emu::test
