// host_memory_test.cpp — pinned host memory: allocation, registration with the real driver's
// answers (measured on an H200), the pinned-bytes counter, and frees that wait for copies.
#include <sys/mman.h>

#include <cstring>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using host_memory = emu_test;

TEST_F(host_memory, AllocFreeAndTheirCount) {
  void* p = nullptr;
  CU_ASSERT(cuMemHostAlloc(&p, 12345, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tagmem_emu_pinned_host_bytes(), 12345u);
  EXPECT_EQ(tagmem_emu_live_host_allocations(), 1u);
  std::memset(p, 0xab, 12345);
  EXPECT_EQ(cuMemFreeHost(static_cast<char*>(p) + 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(p, 100, 0), CUDA_ERROR_INVALID_VALUE);  // pinned already
  CU_ASSERT(cuMemFreeHost(p));
  EXPECT_EQ(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuMemFreeHost(nullptr));
  EXPECT_EQ(tagmem_emu_pinned_host_bytes(), 0u);
  void* none = reinterpret_cast<void*>(1);
  CU_ASSERT(cuMemHostAlloc(&none, 0, 0));  // succeeds with nothing, as measured
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(cuMemHostAlloc(&p, 100, 0x80), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(host_memory, RegistrationAnswersLikeTheDriver) {
  constexpr size_t size = mib;
  auto* m = static_cast<unsigned char*>(
      ::mmap(nullptr, 2 * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  ::munmap(m + size, size);  // a hole right after the range
  CU_ASSERT(cuMemHostRegister(m, size, CU_MEMHOSTREGISTER_PORTABLE));
  EXPECT_EQ(tagmem_emu_pinned_host_bytes(), size);
  EXPECT_EQ(cuMemHostRegister(m, size, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(m + 4096, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostUnregister(m + 4096), CUDA_ERROR_INVALID_VALUE);  // inside, not the start
  CU_ASSERT(cuMemHostUnregister(m));
  EXPECT_EQ(cuMemHostUnregister(m), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CU_ASSERT(cuMemHostRegister(m + 100, 1000, 0));  // unaligned is fine
  CU_ASSERT(cuMemHostUnregister(m + 100));
  EXPECT_EQ(cuMemHostRegister(m, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(m, 4096, 0x40), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(m + size, 4096, 0), CUDA_ERROR_INVALID_VALUE);  // not mapped
  EXPECT_EQ(cuMemHostRegister(m, size + 4096, 0), CUDA_ERROR_INVALID_VALUE);  // runs into it
  EXPECT_EQ(tagmem_emu_pinned_host_bytes(), 0u);
  ::munmap(m, size);
}

TEST_F(host_memory, FreeHostWaitsForCopiesStillUsingIt) {
  mapped_range range(2 * granule);
  const auto data = random_bytes(range.size(), test_seed());
  CU_ASSERT(cuMemcpyHtoD(range.ptr(), data.data(), data.size()));
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, range.size(), 0));
  tagmem_emu_set_copy_bytes_per_second(16 * mib);  // ~250 ms
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuMemcpyDtoHAsync(host, range.ptr(), range.size(), s));
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  CU_ASSERT(cuMemFreeHost(host));
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);  // the copy finished before the memory went
  CU_EXPECT(cuStreamDestroy(s));
}

}  // namespace
}  // namespace tagmem::emu::test
