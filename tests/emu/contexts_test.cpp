// contexts_test.cpp — primary contexts: reference counted, current per thread, and torn down
// like the real driver's when the last reference goes.
#include <cstring>
#include <thread>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using contexts = emu_test;

TEST_F(contexts, CallsWithoutACurrentContextAreRefused) {
  std::thread([] {
    CUcontext current = reinterpret_cast<CUcontext>(1);
    CU_EXPECT(cuCtxGetCurrent(&current));
    EXPECT_EQ(current, nullptr);  // current contexts are per thread
    CUdevice device = -1;
    EXPECT_EQ(cuCtxGetDevice(&device), CUDA_ERROR_INVALID_CONTEXT);
    size_t free = 0, total = 0;
    EXPECT_EQ(cuMemGetInfo(&free, &total), CUDA_ERROR_INVALID_CONTEXT);
    CUstream s = nullptr;
    EXPECT_EQ(cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    void* host = nullptr;
    EXPECT_EQ(cuMemHostAlloc(&host, 4096, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    // Physical memory needs no context.
    const CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 0;
    CU_EXPECT(cuMemCreate(&h, granule, &prop, 0));
    CU_EXPECT(cuMemRelease(h));
  }).join();
}

TEST_F(contexts, PrimaryContextIsOnePerDeviceAndCounted) {
  CUcontext again = nullptr, other = nullptr;
  CU_ASSERT(cuDevicePrimaryCtxRetain(&again, 0));
  EXPECT_EQ(again, ctx_);
  CU_ASSERT(cuDevicePrimaryCtxRetain(&other, 1));
  EXPECT_NE(other, ctx_);
  CU_ASSERT(cuCtxSetCurrent(other));
  CUdevice device = -1;
  CU_ASSERT(cuCtxGetDevice(&device));
  EXPECT_EQ(device, 1);
  CU_ASSERT(cuCtxGetDevice_v2(&device, ctx_));  // the versioned form names its context
  EXPECT_EQ(device, 0);
  CU_EXPECT(cuCtxSynchronize_v2(ctx_));
  CU_ASSERT(cuCtxSetCurrent(ctx_));
  CU_EXPECT(cuDevicePrimaryCtxRelease(1));
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
  CU_EXPECT(cuDevicePrimaryCtxRelease(0));  // back to the fixture's one reference
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&other, 99), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuCtxSetCurrent(reinterpret_cast<CUcontext>(&device)), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(contexts, ReleasingTheLastReferenceDestroysTheContextsObjects) {
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  CUevent e = nullptr;
  CU_ASSERT(cuEventCreate(&e, 0));
  CUdeviceptr block = 0;
  CU_ASSERT(cuMemAlloc(&block, 3 * mib));
  EXPECT_GT(tagmem_emu_device_used_bytes(0), 0u);

  CU_ASSERT(cuDevicePrimaryCtxRelease(0));
  EXPECT_EQ(tagmem_emu_live_device_allocations(), 0u);  // freed with the context
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 0u);
  CUcontext current = nullptr;
  CU_ASSERT(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, ctx_);  // still current, but destroyed
  CUdevice device = -1;
  CU_EXPECT(cuCtxGetDevice(&device));
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);

  CU_ASSERT(cuDevicePrimaryCtxRetain(&ctx_, 0));  // a new life, same handle
  EXPECT_EQ(ctx_, current);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_CONTEXT_IS_DESTROYED);  // old objects stay dead
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(cuStreamDestroy(s), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_EXPECT(cuEventDestroy(e));
  CU_EXPECT(cuCtxSynchronize());
}

TEST_F(contexts, CtxSynchronizeWaitsForEveryStreamOfTheDevice) {
  mapped_range a(granule);
  mapped_range b(granule);
  tagmem_emu_set_copy_bytes_per_second(32 * mib);
  CUstream s1 = nullptr, s2 = nullptr;
  CU_ASSERT(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuStreamCreate(&s2, 0));
  CU_ASSERT(cuMemsetD8Async(a.ptr(), 1, granule, s1));
  CU_ASSERT(cuMemsetD8Async(b.ptr(), 2, granule, s2));
  CU_ASSERT(cuCtxSynchronize());
  EXPECT_EQ(cuStreamQuery(s1), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(s2), CUDA_SUCCESS);
  EXPECT_EQ(a.host()[granule - 1], 1);
  EXPECT_EQ(b.host()[granule - 1], 2);
  CU_EXPECT(cuStreamDestroy(s1));
  CU_EXPECT(cuStreamDestroy(s2));
}

}  // namespace
}  // namespace tagmem::emu::test
