// control_test.cpp — Note [emu fault injection] and call counting: the n-th call fails with no
// side effect, and sweeping n over a workload finds no path that leaks.
#include <thread>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using control = emu_test;

TEST_F(control, TheNthCallFailsOnceWithoutSideEffects) {
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h[3] = {};
  ASSERT_EQ(tagmem_emu_fail_call("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY), 0);
  CU_ASSERT(cuMemCreate(&h[0], granule, &prop, 0));
  const uint64_t used = tagmem_emu_device_used_bytes(0);
  EXPECT_EQ(cuMemCreate(&h[1], granule, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(h[1], 0u);  // not even the output was touched
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), used);
  EXPECT_EQ(tagmem_emu_live_allocations(), 1u);
  CU_ASSERT(cuMemCreate(&h[2], granule, &prop, 0));  // fired once only
  CU_EXPECT(cuMemRelease(h[0]));
  CU_EXPECT(cuMemRelease(h[2]));
}

TEST_F(control, AFaultOnAnyEntryPointCountsEveryCall) {
  ASSERT_EQ(tagmem_emu_fail_call(nullptr, 3, CUDA_ERROR_UNKNOWN), 0);
  int count = 0;
  CUdevice device = 0;
  CU_EXPECT(cuDeviceGetCount(&count));
  CU_EXPECT(cuDeviceGet(&device, 0));
  EXPECT_EQ(cuDriverGetVersion(&count), CUDA_ERROR_UNKNOWN);
  CU_EXPECT(cuDriverGetVersion(&count));
}

TEST_F(control, FaultsCanBeClearedAndBadRequestsAreRefused) {
  ASSERT_EQ(tagmem_emu_fail_call("cuStreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
  tagmem_emu_clear_faults();
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  CU_EXPECT(cuStreamDestroy(s));
  EXPECT_EQ(tagmem_emu_fail_call("cuNoSuchCall", 1, CUDA_ERROR_UNKNOWN), -1);
  EXPECT_EQ(tagmem_emu_fail_call("cuMemMap", 0, CUDA_ERROR_UNKNOWN), -1);
  EXPECT_EQ(tagmem_emu_fail_call("cuMemMap", 1, CUDA_SUCCESS), -1);
  EXPECT_EQ(tagmem_emu_call_count("cuNoSuchCall"), 0u);
}

TEST_F(control, CallsAreCountedPerEntryPointAndInTotal) {
  const uint64_t maps = tagmem_emu_call_count("cuMemMap");
  const uint64_t all = tagmem_emu_call_count(nullptr);
  EXPECT_EQ(cuMemMap(0, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);  // failures count too
  { mapped_range range(granule); }  // reserve, create, map, access, unmap, release, free
  EXPECT_EQ(tagmem_emu_call_count("cuMemMap") - maps, 2u);
  EXPECT_EQ(tagmem_emu_call_count(nullptr) - all, 8u);
}

// A small workload that must clean up after itself whatever call fails.
CUresult workload(const std::vector<unsigned char>& data) {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  CUstream s = nullptr;
  const CUmemAllocationProp prop = device_prop(0);
  const CUmemAccessDesc rw = access(0);
  std::vector<unsigned char> back(data.size());
  CUresult r = cuMemAddressReserve(&va, granule, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    if ((r = cuMemCreate(&h, granule, &prop, 0)) == CUDA_SUCCESS) {
      if ((r = cuMemMap(va, granule, 0, h, 0)) == CUDA_SUCCESS) {
        if ((r = cuMemSetAccess(va, granule, &rw, 1)) == CUDA_SUCCESS &&
            (r = cuStreamCreate(&s, 0)) == CUDA_SUCCESS) {
          if ((r = cuMemcpyHtoDAsync(va, data.data(), data.size(), s)) == CUDA_SUCCESS &&
              (r = cuMemcpyDtoHAsync(back.data(), va, back.size(), s)) == CUDA_SUCCESS &&
              (r = cuStreamSynchronize(s)) == CUDA_SUCCESS && back != data)
            r = CUDA_ERROR_UNKNOWN;
          while (cuStreamDestroy(s) != CUDA_SUCCESS) {
          }  // a cleanup call may be the one failing
        }
        while (cuMemUnmap(va, granule) != CUDA_SUCCESS) {
        }
      }
      while (cuMemRelease(h) != CUDA_SUCCESS) {
      }
    }
    while (cuMemAddressFree(va, granule) != CUDA_SUCCESS) {
    }
  }
  return r;
}

TEST_F(control, SweepingAFaultOverEveryCallOfAWorkloadLeaksNothing) {
  const auto data = random_bytes(granule, test_seed());
  const uint64_t before = tagmem_emu_call_count(nullptr);
  CU_ASSERT(workload(data));
  const uint64_t calls = tagmem_emu_call_count(nullptr) - before;
  EXPECT_EQ(calls, 12u);
  for (uint64_t n = 1; n <= calls; ++n) {
    ASSERT_EQ(tagmem_emu_fail_call(nullptr, n, CUDA_ERROR_NOT_PERMITTED), 0);
    const CUresult r = workload(data);
    tagmem_emu_clear_faults();
    // A failing cleanup call is retried and the work itself still succeeds.
    EXPECT_TRUE(r == CUDA_ERROR_NOT_PERMITTED || (r == CUDA_SUCCESS && n >= 9)) << n;
    EXPECT_EQ(tagmem_emu_live_allocations(), 0u) << n;
    EXPECT_EQ(tagmem_emu_live_mappings(), 0u) << n;
    EXPECT_EQ(tagmem_emu_live_reservations(), 0u) << n;
    EXPECT_EQ(tagmem_emu_live_streams(), 0u) << n;
  }
}

TEST_F(control, CountingAndFaultsAreThreadSafe) {
  constexpr int threads = 8;
  constexpr int calls = 2000;
  const uint64_t before = tagmem_emu_call_count("cuDriverGetVersion");
  ASSERT_EQ(tagmem_emu_fail_call("cuDriverGetVersion", threads * calls / 2, CUDA_ERROR_UNKNOWN), 0);
  std::atomic<int> failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      int version = 0;
      for (int i = 0; i < calls; ++i)
        if (cuDriverGetVersion(&version) != CUDA_SUCCESS) ++failed;
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(tagmem_emu_call_count("cuDriverGetVersion") - before, uint64_t{threads * calls});
  EXPECT_EQ(failed.load(), 1);
}

}  // namespace
}  // namespace tagmem::emu::test
