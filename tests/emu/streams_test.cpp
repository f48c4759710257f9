// streams_test.cpp — Note [emu streams] and Note [emu sticky errors]: created streams run their
// operations later, in order; events and waits order them across streams; the NULL stream waits
// for blocking streams only; a copy that loses its memory while it runs poisons the context the
// way the real driver does.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using streams = emu_test;

TEST_F(streams, OperationsRunInSubmissionOrder) {
  mapped_range range(granule);
  tagmem_emu_set_copy_bytes_per_second(64 * mib);
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  const auto first = random_bytes(granule, test_seed());
  const auto second = random_bytes(granule / 2, test_seed() + 1);
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, granule + granule / 2, 0));
  auto* bytes = static_cast<unsigned char*>(host);
  std::memcpy(bytes, first.data(), granule);
  std::memcpy(bytes + granule, second.data(), granule / 2);
  CU_ASSERT(cuMemsetD8Async(range.ptr(), 0x11, granule, s));
  CU_ASSERT(cuMemcpyHtoDAsync(range.ptr(), bytes, granule, s));
  CU_ASSERT(cuMemcpyHtoDAsync(range.ptr() + 100, bytes + granule, granule / 2, s));
  CU_ASSERT(cuMemsetD8Async(range.ptr() + 7, 0x22, 3, s));
  CU_ASSERT(cuStreamSynchronize(s));
  auto expected = first;
  std::memcpy(expected.data() + 100, second.data(), granule / 2);
  std::memset(expected.data() + 7, 0x22, 3);
  EXPECT_EQ(std::memcmp(range.host(), expected.data(), granule), 0);
  CU_EXPECT(cuStreamDestroy(s));
  CU_EXPECT(cuMemFreeHost(host));
}

TEST_F(streams, WaitEventOrdersWorkAcrossStreams) {
  mapped_range a(granule);
  mapped_range b(granule);
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, granule, 0));
  const auto data = random_bytes(granule, test_seed());
  std::memcpy(host, data.data(), granule);
  tagmem_emu_set_copy_bytes_per_second(8 * mib);
  CUstream producer = nullptr, consumer = nullptr;
  CU_ASSERT(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuStreamCreate(&consumer, CU_STREAM_NON_BLOCKING));
  CUevent ready = nullptr;
  CU_ASSERT(cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING));
  CU_ASSERT(cuMemcpyHtoDAsync(a.ptr(), host, granule, producer));
  CU_ASSERT(cuEventRecord(ready, producer));
  EXPECT_EQ(cuEventQuery(ready), CUDA_ERROR_NOT_READY);
  CU_ASSERT(cuStreamWaitEvent(consumer, ready, 0));
  CU_ASSERT(cuMemcpyDtoDAsync(b.ptr(), a.ptr(), granule, consumer));
  CU_ASSERT(cuStreamSynchronize(consumer));
  EXPECT_EQ(cuEventQuery(ready), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(b.host(), data.data(), granule), 0);
  EXPECT_EQ(cuStreamWaitEvent(consumer, ready, 5), CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuEventDestroy(ready));
  CU_EXPECT(cuStreamDestroy(producer));
  CU_EXPECT(cuStreamDestroy(consumer));
  CU_EXPECT(cuMemFreeHost(host));
}

TEST_F(streams, NullStreamWaitsForBlockingStreamsOnly) {
  mapped_range range(2 * granule);
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, 2 * granule, 0));
  const auto data = random_bytes(granule, test_seed());
  std::memcpy(host, data.data(), granule);
  tagmem_emu_set_copy_bytes_per_second(8 * mib);  // ~250 ms per granule
  CUstream blocking = nullptr, non_blocking = nullptr;
  CU_ASSERT(cuStreamCreate(&blocking, 0));
  CU_ASSERT(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));

  CU_ASSERT(cuMemcpyHtoDAsync(range.ptr(), host, granule, blocking));
  std::vector<unsigned char> back(granule);
  CU_ASSERT(cuMemcpyDtoH(back.data(), range.ptr(), granule));  // NULL stream: waits for it
  EXPECT_EQ(back, data);

  CU_ASSERT(cuMemsetD8Async(range.ptr() + granule, 1, granule, non_blocking));
  CUevent mark = nullptr;
  CU_ASSERT(cuEventCreate(&mark, 0));
  CU_ASSERT(cuEventRecord(mark, nullptr));  // does not wait for the non-blocking stream
  EXPECT_EQ(cuEventQuery(mark), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(non_blocking), CUDA_ERROR_NOT_READY);
  CU_ASSERT(cuCtxSynchronize());  // waits for every stream
  EXPECT_EQ(cuStreamQuery(non_blocking), CUDA_SUCCESS);
  CU_EXPECT(cuEventDestroy(mark));
  CU_EXPECT(cuStreamDestroy(blocking));
  CU_EXPECT(cuStreamDestroy(non_blocking));
  CU_EXPECT(cuMemFreeHost(host));
}

TEST_F(streams, EventsMeasureRealTime) {
  mapped_range range(4 * granule);
  tagmem_emu_set_copy_bytes_per_second(32 * mib);  // 8 MiB: 250 ms
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  CUevent start = nullptr, end = nullptr, untimed = nullptr, never = nullptr;
  CU_ASSERT(cuEventCreate(&start, 0));
  CU_ASSERT(cuEventCreate(&end, CU_EVENT_BLOCKING_SYNC));
  CU_ASSERT(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  CU_ASSERT(cuEventCreate(&never, 0));
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime(&ms, start, never), CUDA_ERROR_INVALID_HANDLE);  // unrecorded
  EXPECT_EQ(cuEventQuery(never), CUDA_SUCCESS);
  CU_ASSERT(cuEventRecord(start, s));
  CU_ASSERT(cuMemsetD8Async(range.ptr(), 3, range.size(), s));
  CU_ASSERT(cuEventRecord(end, s));
  CU_ASSERT(cuEventRecord(untimed, s));
  EXPECT_EQ(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_NOT_READY);
  CU_ASSERT(cuEventSynchronize(end));
  CU_ASSERT(cuEventElapsedTime(&ms, start, end));
  EXPECT_GE(ms, 0.9f * 250.0f);
  EXPECT_LT(ms, 10000.0f);
  float back = 0;
  CU_ASSERT(cuEventElapsedTime(&back, end, start));
  EXPECT_FLOAT_EQ(back, -ms);
  CU_ASSERT(cuEventSynchronize(untimed));
  EXPECT_EQ(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventCreate(&never, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuEventCreate(&never, 0x40), CUDA_ERROR_INVALID_VALUE);
  for (CUevent e : {start, end, untimed, never}) CU_EXPECT(cuEventDestroy(e));
  EXPECT_EQ(cuEventDestroy(start), CUDA_ERROR_INVALID_HANDLE);
  CU_EXPECT(cuStreamDestroy(s));
}

TEST_F(streams, DestroyWaitsForQueuedWork) {
  mapped_range range(2 * granule);
  tagmem_emu_set_copy_bytes_per_second(64 * mib);
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  CU_ASSERT(cuMemsetD8Async(range.ptr(), 0x42, range.size(), s));
  CU_ASSERT(cuStreamDestroy(s));
  EXPECT_EQ(range.host()[range.size() - 1], 0x42);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  CU_EXPECT(cuStreamSynchronize(nullptr));
  CU_EXPECT(cuStreamQuery(nullptr));
  EXPECT_EQ(cuStreamCreate(&s, 7), CUDA_ERROR_INVALID_VALUE);
}

// The bug the asynchrony exists to expose: unmapping memory a queued copy still reads.
TEST_F(streams, UnmapUnderARunningCopyPoisonsTheContext) {
  auto range = std::make_unique<mapped_range>(8 * granule);
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, range->size(), 0));
  tagmem_emu_set_copy_bytes_per_second(32 * mib);  // 16 MiB: ~500 ms
  CUstream s = nullptr, other = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuMemcpyDtoHAsync(host, range->ptr(), range->size(), s));
  range.reset();  // unmap, release, free the reservation: all succeed, as on the GPU
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_LAUNCH_FAILED);
  // The whole context is poisoned...
  EXPECT_EQ(cuStreamQuery(other), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_LAUNCH_FAILED);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_LAUNCH_FAILED);
  size_t free = 0, total = 0;
  EXPECT_EQ(cuMemGetInfo(&free, &total), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(tagmem_emu_sticky_error(0), CUDA_ERROR_LAUNCH_FAILED);
  // ...while context-free calls still work.
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_EXPECT(cuMemCreate(&h, granule, &prop, 0));
  CU_EXPECT(cuMemRelease(h));
  EXPECT_EQ(cuStreamDestroy(s), CUDA_ERROR_LAUNCH_FAILED);  // destroyed all the same
  EXPECT_EQ(cuStreamDestroy(other), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(cuMemFreeHost(host), CUDA_ERROR_LAUNCH_FAILED);
  // Releasing the primary context is the way back.
  CU_ASSERT(cuDevicePrimaryCtxRelease(0));
  EXPECT_EQ(tagmem_emu_sticky_error(0), CUDA_SUCCESS);
  CU_ASSERT(cuDevicePrimaryCtxRetain(&ctx_, 0));
  CU_EXPECT(cuMemFreeHost(host));
}

TEST_F(streams, MemsetOnLostMemoryIsAnIllegalAddress) {
  auto range = std::make_unique<mapped_range>(8 * granule);
  tagmem_emu_set_copy_bytes_per_second(32 * mib);
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  CU_ASSERT(cuMemsetD8Async(range->ptr(), 9, range->size(), s));
  const CUmemAccessDesc none = access(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_ASSERT(cuMemSetAccess(range->ptr(), range->size(), &none, 1));  // access taken away
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cuStreamDestroy(s), CUDA_ERROR_ILLEGAL_ADDRESS);
  range.reset();
  EXPECT_EQ(tagmem_emu_clear_sticky_error(0), 0);
  CU_EXPECT(cuCtxSynchronize());
}

TEST_F(streams, ManyThreadsManyStreams) {
  constexpr int threads = 6;
  constexpr int rounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return void(++failures);
      CUstream s = nullptr;
      if (cuStreamCreate(&s, t % 2 ? CU_STREAM_NON_BLOCKING : 0) != CUDA_SUCCESS)
        return void(++failures);
      for (int r = 0; r < rounds; ++r) {
        mapped_range range(granule);
        const auto data = random_bytes(granule, test_seed() + t * rounds + r);
        std::vector<unsigned char> back(granule);
        if (cuMemcpyHtoDAsync(range.ptr(), data.data(), granule, s) != CUDA_SUCCESS ||
            cuMemcpyDtoHAsync(back.data(), range.ptr(), granule, s) != CUDA_SUCCESS ||
            cuStreamSynchronize(s) != CUDA_SUCCESS || back != data)
          ++failures;
      }
      if (cuStreamDestroy(s) != CUDA_SUCCESS) ++failures;
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace tagmem::emu::test
