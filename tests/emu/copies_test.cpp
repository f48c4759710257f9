// copies_test.cpp — copies and memsets: bytes arrive intact, device ranges are checked at call
// time (as measured on the real driver), and pageable and pinned host memory follow the real
// driver's rules for asynchronous copies.
#include <chrono>
#include <cstring>
#include <thread>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using copies = emu_test;

TEST_F(copies, AsyncCopiesSpanningMappingsArriveIntact) {
  // 3 adjacent mappings, 12 MiB, copied in one call: more than one copy piece, across mappings.
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 6 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  const CUmemAccessDesc rw = access(0);
  CUmemGenericAllocationHandle h[3];
  for (int i = 0; i < 3; ++i) {
    CU_ASSERT(cuMemCreate(&h[i], 2 * granule, &prop, 0));
    CU_ASSERT(cuMemMap(va + i * 2 * granule, 2 * granule, 0, h[i], 0));
  }
  CU_ASSERT(cuMemSetAccess(va, 6 * granule, &rw, 1));
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, 6 * granule, 0));
  const auto data = random_bytes(6 * granule - 3, test_seed());
  std::memcpy(host, data.data(), data.size());
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuMemcpyHtoDAsync(va + 1, host, data.size(), s));
  std::vector<unsigned char> back(data.size());
  CU_ASSERT(cuMemcpyDtoHAsync(back.data(), va + 1, back.size(), s));  // pageable: done on return
  EXPECT_EQ(back, data);
  CU_EXPECT(cuStreamDestroy(s));
  CU_EXPECT(cuMemFreeHost(host));
  CU_EXPECT(cuMemUnmap(va, 6 * granule));
  for (auto handle : h) CU_EXPECT(cuMemRelease(handle));
  CU_EXPECT(cuMemAddressFree(va, 6 * granule));
}

TEST_F(copies, DeviceToDeviceAndMemsetOnAStream) {
  mapped_range a(2 * granule);
  mapped_range b(2 * granule);
  const auto data = random_bytes(a.size(), test_seed());
  CU_ASSERT(cuMemcpyHtoD(a.ptr(), data.data(), data.size()));
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  CU_ASSERT(cuMemcpyDtoDAsync(b.ptr(), a.ptr(), a.size(), s));
  const unsigned char value = data[0] ^ 0xff;
  CU_ASSERT(cuMemsetD8Async(b.ptr() + 1000, value, 5000, s));
  CU_ASSERT(cuStreamSynchronize(s));
  auto expected = data;
  std::memset(expected.data() + 1000, value, 5000);
  std::vector<unsigned char> back(b.size());
  CU_ASSERT(cuMemcpyDtoH(back.data(), b.ptr(), back.size()));
  EXPECT_EQ(back, expected);
  CU_EXPECT(cuStreamDestroy(s));
}

TEST_F(copies, CopiesBetweenDevicesWithAccessForTheStreamsDevice) {
  mapped_range on0(granule, 0);
  mapped_range on1(granule, 1);
  const auto data = random_bytes(granule, test_seed());
  CU_ASSERT(cuMemcpyHtoD(on0.ptr(), data.data(), data.size()));
  // A stream of device 0 may not write memory only device 1 can access...
  EXPECT_EQ(cuMemcpyDtoDAsync(on1.ptr(), on0.ptr(), granule, nullptr), CUDA_ERROR_INVALID_VALUE);
  // ...until device 0 is granted access too (peer access through cuMemSetAccess).
  const CUmemAccessDesc both[] = {access(0), access(1)};
  CU_ASSERT(cuMemSetAccess(on1.ptr(), granule, both, 2));
  CU_ASSERT(cuMemcpyDtoDAsync(on1.ptr(), on0.ptr(), granule, nullptr));
  std::vector<unsigned char> back(granule);
  CU_ASSERT(cuMemcpyDtoH(back.data(), on1.ptr(), granule));
  EXPECT_EQ(back, data);
}

TEST_F(copies, InaccessibleDeviceRangesAreRefusedAtCallTime) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 2 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, granule, &prop, 0));
  CU_ASSERT(cuMemMap(va, granule, 0, h, 0));
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, 0));
  std::vector<unsigned char> buf(4096);
  for (CUdeviceptr p : {va /* mapped, no access */, va + granule /* reserved, unmapped */,
                        CUdeviceptr{0x1000} /* nothing */}) {
    EXPECT_EQ(cuMemcpyHtoD(p, buf.data(), buf.size()), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuMemcpyDtoH(buf.data(), p, buf.size()), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuMemcpyHtoDAsync(p, buf.data(), buf.size(), s), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuMemcpyDtoHAsync(buf.data(), p, buf.size(), s), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuMemsetD8Async(p, 0, buf.size(), s), CUDA_ERROR_INVALID_VALUE);
  }
  const CUmemAccessDesc rw = access(0);
  CU_ASSERT(cuMemSetAccess(va, granule, &rw, 1));
  // A copy running past the end of the mapping into unmapped space is refused as a whole.
  EXPECT_EQ(cuMemcpyHtoDAsync(va + granule - 100, buf.data(), buf.size(), s),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyHtoDAsync(va, nullptr, buf.size(), s), CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuMemcpyHtoDAsync(va, nullptr, 0, s));  // nothing to copy
  CU_EXPECT(cuStreamSynchronize(s));                // nothing faulted: all was refused up front
  CU_EXPECT(cuStreamDestroy(s));
  CU_EXPECT(cuMemUnmap(va, granule));
  CU_EXPECT(cuMemRelease(h));
  CU_EXPECT(cuMemAddressFree(va, 2 * granule));
}

TEST_F(copies, PageableSourceIsStagedBeforeTheCallReturns) {
  mapped_range range(granule);
  auto data = random_bytes(granule, test_seed());
  const auto original = data;
  tagmem_emu_set_copy_bytes_per_second(8 * mib);  // the copy takes ~250 ms
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuMemcpyHtoDAsync(range.ptr(), data.data(), data.size(), s));
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  std::fill(data.begin(), data.end(), 0);  // allowed right away for pageable memory
  CU_ASSERT(cuStreamSynchronize(s));
  EXPECT_EQ(std::memcmp(range.host(), original.data(), granule), 0);
  CU_EXPECT(cuStreamDestroy(s));
}

TEST_F(copies, PinnedCopiesAreAsynchronous) {
  mapped_range range(granule);
  const auto data = random_bytes(granule, test_seed());
  CU_ASSERT(cuMemcpyHtoD(range.ptr(), data.data(), data.size()));
  void* host = nullptr;
  CU_ASSERT(cuMemHostAlloc(&host, granule, 0));
  std::memset(host, 0, granule);
  tagmem_emu_set_copy_bytes_per_second(8 * mib);
  CUstream s = nullptr;
  CU_ASSERT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_ASSERT(cuMemcpyDtoHAsync(host, range.ptr(), granule, s));
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);  // returned before the bytes moved
  CU_ASSERT(cuStreamSynchronize(s));
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(host, data.data(), granule), 0);
  CU_EXPECT(cuStreamDestroy(s));
  CU_EXPECT(cuMemFreeHost(host));
}

TEST_F(copies, ThrottleSetsCopySpeed) {
  mapped_range range(4 * granule);
  std::vector<unsigned char> buf(range.size());
  tagmem_emu_set_copy_bytes_per_second(64 * mib);
  const auto start = std::chrono::steady_clock::now();
  CU_ASSERT(cuMemcpyDtoH(buf.data(), range.ptr(), buf.size()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 0.9 * 8.0 / 64.0);
}

}  // namespace
}  // namespace tagmem::emu::test
