// memops_test.cpp — cuStreamWaitValue32: a stream holds what follows the wait until the word in
// pinned host memory passes the test, copies behind it included; other streams go on; bad flags
// and addresses are refused before anything is queued.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using memops = emu_test;

void store(void* word, uint32_t value) {
  std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(word)).store(value);
}
CUdeviceptr device_address(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// A device-to-host copy queued after a wait for 0 does not run while the word reads 1, a copy on
// another stream does, and the held one runs once the word is 0, every byte of it.
TEST_F(memops, WaitHoldsTheCopiesBehindItUntilTheWordPasses) {
  mapped_range range(granule);
  const auto data = random_bytes(granule, test_seed());
  CU_ASSERT(cuMemcpyHtoD(range.ptr(), data.data(), granule));
  void* word = nullptr;
  void* out = nullptr;
  void* other = nullptr;
  CU_ASSERT(cuMemHostAlloc(&word, 4, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CU_ASSERT(cuMemHostAlloc(&out, granule, 0));
  CU_ASSERT(cuMemHostAlloc(&other, granule, 0));
  std::memset(out, 0, granule);
  store(word, 1);
  CUstream held = nullptr, free_stream = nullptr;
  CU_ASSERT(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuStreamCreate(&free_stream, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuStreamWaitValue32(held, device_address(word), 0, CU_STREAM_WAIT_VALUE_EQ));
  CU_ASSERT(cuMemcpyDtoHAsync(out, range.ptr(), granule, held));
  CU_ASSERT(cuMemcpyDtoHAsync(other, range.ptr(), granule, free_stream));
  CU_ASSERT(cuStreamSynchronize(free_stream));
  EXPECT_EQ(std::memcmp(other, data.data(), granule), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cuStreamQuery(held), CUDA_ERROR_NOT_READY);
  EXPECT_NE(std::memcmp(out, data.data(), granule), 0) << "the copy ran past the wait";
  store(word, 0);
  CU_ASSERT(cuStreamSynchronize(held));
  EXPECT_EQ(std::memcmp(out, data.data(), granule), 0);
  CU_EXPECT(cuStreamDestroy(held));
  CU_EXPECT(cuStreamDestroy(free_stream));
  for (void* p : {word, out, other}) CU_EXPECT(cuMemFreeHost(p));
}

// The four tests, as the driver documents them (GEQ is cyclic).
TEST_F(memops, TestsPassAsDocumented) {
  void* word = nullptr;
  CU_ASSERT(cuMemHostAlloc(&word, 4, 0));
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  struct probe {
    uint32_t word, value;
    unsigned flags;
    bool passes;
    uint32_t passing;  // a word that passes, to let a held wait go
  };
  const probe probes[] = {
      {5, 5, CU_STREAM_WAIT_VALUE_EQ, true, 5},
      {4, 5, CU_STREAM_WAIT_VALUE_EQ, false, 5},
      {6, 5, CU_STREAM_WAIT_VALUE_GEQ, true, 6},
      {4, 5, CU_STREAM_WAIT_VALUE_GEQ, false, 5},
      {2, 0xfffffffe, CU_STREAM_WAIT_VALUE_GEQ, true, 2},  // cyclic: 2 comes after 0xfffffffe
      {6, 2, CU_STREAM_WAIT_VALUE_AND, true, 6},
      {4, 2, CU_STREAM_WAIT_VALUE_AND, false, 2},
      {1, 2, CU_STREAM_WAIT_VALUE_NOR, true, 1},
      {0xffffffff, 0, CU_STREAM_WAIT_VALUE_NOR, false, 0},
  };
  for (const probe& p : probes) {
    store(word, p.word);
    CU_ASSERT(cuStreamWaitValue32(s, device_address(word), p.value, p.flags));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cuStreamQuery(s) == CUDA_SUCCESS, p.passes)
        << "word " << p.word << " value " << p.value << " flags " << p.flags;
    store(word, p.passing);
    CU_ASSERT(cuStreamSynchronize(s));
  }
  CU_EXPECT(cuStreamDestroy(s));
  CU_EXPECT(cuMemFreeHost(word));
}

TEST_F(memops, BadFlagsAndAddressesAreRefused) {
  void* word = nullptr;
  CU_ASSERT(cuMemHostAlloc(&word, 8, 0));
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(cuStreamWaitValue32(s, device_address(word), 0, CU_STREAM_WAIT_VALUE_FLUSH),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamWaitValue32(s, device_address(word), 0, 0x10), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamWaitValue32(s, device_address(word) + 2, 0, CU_STREAM_WAIT_VALUE_EQ),
            CUDA_ERROR_INVALID_VALUE);
  uint32_t pageable = 0;
  EXPECT_EQ(cuStreamWaitValue32(s, device_address(&pageable), 0, CU_STREAM_WAIT_VALUE_EQ),
            CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuStreamSynchronize(s));  // nothing was queued
  CU_EXPECT(cuStreamDestroy(s));
  CU_EXPECT(cuMemFreeHost(word));
}

}  // namespace
}  // namespace tagmem::emu::test
