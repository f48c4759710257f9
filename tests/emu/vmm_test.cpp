// vmm_test.cpp — reservations, physical allocations, map/unmap/access, and memory going back
// to the OS: the cuMem calls behave as the real driver's (measured on an H200) and memory that
// is not mapped with access faults when touched.
#include <sys/mman.h>

#include <cstring>

#include "support.hpp"

namespace tagmem::emu::test {
namespace {

using vmm = emu_test;
using vmm_death = emu_test;

TEST_F(vmm, MappedBytesRoundTripThroughCopies) {
  mapped_range range(3 * granule);
  const auto data = random_bytes(range.size(), test_seed());
  std::vector<unsigned char> back(range.size());
  CU_ASSERT(cuMemcpyHtoD(range.ptr(), data.data(), data.size()));
  CU_ASSERT(cuMemcpyDtoH(back.data(), range.ptr(), back.size()));
  EXPECT_EQ(back, data);
  // Host memory underneath: the CPU sees the same bytes through the mapping.
  EXPECT_EQ(std::memcmp(range.host(), data.data(), data.size()), 0);
}

TEST_F(vmm, ReserveHonoursAlignmentAndHint) {
  CUdeviceptr a = 0;
  CU_ASSERT(cuMemAddressReserve(&a, 4 * granule, size_t{1} << 30, 0, 0));
  EXPECT_EQ(a % (size_t{1} << 30), 0u);
  CUdeviceptr b = 0;
  CU_ASSERT(cuMemAddressReserve(&b, granule, 4096, 0, 0));  // small alignments become 2 MiB
  EXPECT_EQ(b % granule, 0u);
  CUdeviceptr freed = 0;  // an address known to be free: just given back
  CU_ASSERT(cuMemAddressReserve(&freed, granule, 0, 0, 0));
  CU_ASSERT(cuMemAddressFree(freed, granule));
  CUdeviceptr c = 0;
  CU_ASSERT(cuMemAddressReserve(&c, granule, 0, freed, 0));
  EXPECT_EQ(c, freed);
  CU_EXPECT(cuMemAddressFree(a, 4 * granule));
  CU_EXPECT(cuMemAddressFree(b, granule));
  CU_EXPECT(cuMemAddressFree(c, granule));
}

TEST_F(vmm, ReserveRejectsBadArguments) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAddressReserve(&p, 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&p, granule + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&p, granule, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&p, granule, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(nullptr, granule, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(vmm, AddressFreeTakesExactlyOneUnmappedReservation) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 4 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, granule, &prop, 0));
  CU_ASSERT(cuMemMap(va + granule, granule, 0, h, 0));
  EXPECT_EQ(cuMemAddressFree(va, 4 * granule), CUDA_ERROR_INVALID_VALUE);  // still mapped
  CU_ASSERT(cuMemUnmap(va + granule, granule));
  EXPECT_EQ(cuMemAddressFree(va, 2 * granule), CUDA_ERROR_INVALID_VALUE);  // part of it
  EXPECT_EQ(cuMemAddressFree(va + granule, 3 * granule), CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuMemAddressFree(va, 4 * granule));
  EXPECT_EQ(cuMemAddressFree(va, 4 * granule), CUDA_ERROR_INVALID_VALUE);  // twice
  CU_EXPECT(cuMemRelease(h));
}

TEST_F(vmm, MapChecksRangeHandleAndSize) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 4 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, 2 * granule, &prop, 0));
  EXPECT_EQ(cuMemMap(va + 4096, 2 * granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(va, 2 * granule, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(va, granule, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // part of it
  EXPECT_EQ(cuMemMap(va, 4 * granule, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuMemMap(va, granule, granule, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // offset
  EXPECT_EQ(cuMemMap(va + 3 * granule, 2 * granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(va, 2 * granule, 0, h + 1000, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT(cuMemMap(va, 2 * granule, 0, h, 0));
  EXPECT_EQ(cuMemMap(va + granule, 2 * granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // overlap
  CU_ASSERT(cuMemMap(va + 2 * granule, 2 * granule, 0, h, 0));  // the same allocation twice
  EXPECT_EQ(tagmem_emu_live_mappings(), 2u);
  CU_EXPECT(cuMemRelease(h));
  EXPECT_EQ(cuMemMap(va, 2 * granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // released
  CU_EXPECT(cuMemUnmap(va, 4 * granule));
  CU_EXPECT(cuMemAddressFree(va, 4 * granule));
}

TEST_F(vmm, OneAllocationMappedTwiceShowsTheSameBytes) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 2 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  const CUmemAccessDesc rw = access(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, granule, &prop, 0));
  CU_ASSERT(cuMemMap(va, granule, 0, h, 0));
  CU_ASSERT(cuMemMap(va + granule, granule, 0, h, 0));
  CU_ASSERT(cuMemSetAccess(va, 2 * granule, &rw, 1));
  const auto data = random_bytes(granule, test_seed());
  CU_ASSERT(cuMemcpyHtoD(va, data.data(), granule));
  std::vector<unsigned char> back(granule);
  CU_ASSERT(cuMemcpyDtoH(back.data(), va + granule, granule));
  EXPECT_EQ(back, data);
  CU_EXPECT(cuMemUnmap(va, 2 * granule));
  CU_EXPECT(cuMemRelease(h));
  CU_EXPECT(cuMemAddressFree(va, 2 * granule));
}

TEST_F(vmm, SetAccessAndUnmapTakeWholeMappings) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 8 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  const CUmemAccessDesc rw = access(0);
  CUmemGenericAllocationHandle a = 0, b = 0;
  CU_ASSERT(cuMemCreate(&a, 2 * granule, &prop, 0));
  CU_ASSERT(cuMemCreate(&b, 2 * granule, &prop, 0));
  CU_ASSERT(cuMemMap(va, 2 * granule, 0, a, 0));
  CU_ASSERT(cuMemMap(va + 2 * granule, 2 * granule, 0, b, 0));
  EXPECT_EQ(cuMemSetAccess(va, granule, &rw, 1), CUDA_ERROR_INVALID_VALUE);      // half a mapping
  EXPECT_EQ(cuMemSetAccess(va, 6 * granule, &rw, 1), CUDA_ERROR_INVALID_VALUE);  // a gap
  EXPECT_EQ(cuMemSetAccess(va, 4 * granule, &rw, 0), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc host = rw;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_EQ(cuMemSetAccess(va, 4 * granule, &host, 1), CUDA_ERROR_NOT_SUPPORTED);
  CUmemAccessDesc bad = rw;
  bad.location.id = 99;
  EXPECT_EQ(cuMemSetAccess(va, 4 * granule, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT(cuMemSetAccess(va, 4 * granule, &rw, 1));  // across both mappings

  EXPECT_EQ(cuMemUnmap(va, granule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va + granule, 2 * granule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va, 8 * granule), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT(cuMemUnmap(va, 4 * granule));                            // both at once
  EXPECT_EQ(cuMemUnmap(va, 2 * granule), CUDA_ERROR_INVALID_VALUE);  // stricter than the GPU
  EXPECT_EQ(tagmem_emu_live_mappings(), 0u);
  CU_EXPECT(cuMemRelease(a));
  CU_EXPECT(cuMemRelease(b));
  CU_EXPECT(cuMemAddressFree(va, 8 * granule));
}

TEST_F(vmm, AccessIsPerDeviceAndReadOnlyRefusesWrites) {
  mapped_range range(granule);
  const CUmemAccessDesc ro = access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  CU_ASSERT(cuMemSetAccess(range.ptr(), granule, &ro, 1));
  std::vector<unsigned char> buf(4096, 7);
  EXPECT_EQ(cuMemcpyHtoD(range.ptr(), buf.data(), buf.size()), CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuMemcpyDtoH(buf.data(), range.ptr(), buf.size()));

  // Device 1 has no access: its streams may not touch the range.
  CUcontext ctx1 = nullptr;
  CU_ASSERT(cuDevicePrimaryCtxRetain(&ctx1, 1));
  CU_ASSERT(cuCtxSetCurrent(ctx1));
  EXPECT_EQ(cuMemcpyDtoH(buf.data(), range.ptr(), buf.size()), CUDA_ERROR_INVALID_VALUE);
  const CUmemAccessDesc both[] = {access(0), access(1)};
  CU_ASSERT(cuMemSetAccess(range.ptr(), granule, both, 2));
  CU_EXPECT(cuMemcpyHtoD(range.ptr(), buf.data(), buf.size()));
  CU_EXPECT(cuCtxSetCurrent(ctx_));
  CU_EXPECT(cuDevicePrimaryCtxRelease(1));
}

TEST_F(vmm, RetainAllocationHandleReturnsTheMappedHandle) {
  mapped_range range(2 * granule);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(range.ptr() + 12345)));
  EXPECT_EQ(h, range.handle());
  CU_EXPECT(cuMemRelease(h));  // each retain needs its release
  EXPECT_EQ(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(range.ptr() + 2 * granule)),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemRetainAllocationHandle(nullptr, reinterpret_cast<void*>(range.ptr())),
            CUDA_ERROR_INVALID_VALUE);

  // Released while mapped: the handle comes back, with the same value, by address.
  CU_ASSERT(cuMemRelease(range.handle()));
  EXPECT_EQ(cuMemRelease(range.handle()), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(range.ptr())));
  EXPECT_EQ(h, range.handle());
  range.reset();  // unmaps and releases the retained reference
}

TEST_F(vmm, PropertiesComeBackFromTheHandle) {
  CUmemAllocationProp prop = device_prop(1, /*shareable=*/true);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, granule, &prop, 0));
  CUmemAllocationProp got{};
  CU_ASSERT(cuMemGetAllocationPropertiesFromHandle(&got, h));
  EXPECT_EQ(std::memcmp(&got, &prop, sizeof prop), 0);
  CU_EXPECT(cuMemRelease(h));
  EXPECT_EQ(cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(vmm, DeviceBytesCountUntilReleasedAndUnmapped) {
  size_t free0 = 0, total = 0;
  CU_ASSERT(cuMemGetInfo(&free0, &total));
  EXPECT_EQ(total, tagmem_emu_device_bytes(0));
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 4 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, 4 * granule, &prop, 0));
  size_t free1 = 0;
  CU_ASSERT(cuMemGetInfo(&free1, &total));
  EXPECT_EQ(free0 - free1, 4 * granule);
  CU_ASSERT(cuMemMap(va, 4 * granule, 0, h, 0));
  CU_ASSERT(cuMemRelease(h));
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 4 * granule);  // still mapped
  EXPECT_EQ(tagmem_emu_live_allocations(), 1u);
  CU_ASSERT(cuMemUnmap(va, 4 * granule));
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 0u);
  EXPECT_EQ(tagmem_emu_live_allocations(), 0u);
  CU_EXPECT(cuMemAddressFree(va, 4 * granule));
}

TEST_F(vmm, MemoryReturnsToTheOsOnlyWhenReleasedAndUnmapped) {
  constexpr size_t size = 64 * mib;
  const int memfds = emulator_memfds();
  mapped_range range(size);
  std::memset(range.host(), 0x5a, size);  // touch every page
  const size_t touched = rss_bytes();
  CU_ASSERT(cuMemRelease(range.handle()));
  // Released but mapped: the bytes stay, resident, readable.
  EXPECT_GE(rss_bytes() + 8 * mib, touched);
  EXPECT_EQ(range.host()[size - 1], 0x5a);
  CU_ASSERT(cuMemUnmap(range.ptr(), size));
  EXPECT_LE(rss_bytes() + size - 8 * mib, touched) << "unmapping did not give the pages back";
  EXPECT_EQ(emulator_memfds(), memfds) << "the memfd is still open";
  EXPECT_EQ(emulator_memfd_mappings(), 0);
  CU_EXPECT(cuMemAddressFree(range.ptr(), size));
  range.disown();
}

TEST_F(vmm, CreateChecksItsProperties) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop(0);
  EXPECT_EQ(cuMemCreate(&h, 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&h, granule, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&h, granule, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(nullptr, granule, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&h, size_t{1} << 50, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  prop.location.id = tagmem_emu_device_count();
  EXPECT_EQ(cuMemCreate(&h, granule, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  EXPECT_EQ(cuMemCreate(&h, granule, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  EXPECT_EQ(cuMemCreate(&h, granule, &prop, 0), CUDA_ERROR_INVALID_VALUE);  // not IPC capable
  EXPECT_EQ(tagmem_emu_live_allocations(), 0u);
}

TEST_F(vmm, HostLocatedAllocationsServeDevicesAndTheHost) {
  // How NCCL allocates its host buffers: host-located, shareable, accessed by device and host.
  CUmemAllocationProp prop = device_prop(0);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, 2 * granule, &prop, 0));
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 0u);  // not device memory
  EXPECT_EQ(tagmem_emu_live_allocations(), 1u);
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, 2 * granule, 0, 0, 0));
  CU_ASSERT(cuMemMap(va, 2 * granule, 0, h, 0));
  CUmemAccessDesc desc[] = {access(0), access(0)};
  desc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  CU_ASSERT(cuMemSetAccess(va, 2 * granule, desc, 2));
  const auto data = random_bytes(2 * granule, test_seed());
  std::memcpy(reinterpret_cast<void*>(va), data.data(), data.size());  // the host writes
  std::vector<unsigned char> back(data.size());
  CU_ASSERT(cuMemcpyDtoH(back.data(), va, back.size()));  // the device reads
  EXPECT_EQ(back, data);
  CU_EXPECT(cuMemUnmap(va, 2 * granule));
  CU_EXPECT(cuMemRelease(h));
  CU_EXPECT(cuMemAddressFree(va, 2 * granule));
}

// ---- touching memory that is not mapped with access faults ---------------------------------

void touch(CUdeviceptr p) { *reinterpret_cast<volatile unsigned char*>(p) = 1; }

TEST_F(vmm_death, TouchingReservedButUnmappedMemoryFaults) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, granule, 0, 0, 0));
  EXPECT_DEATH(touch(va + 100), "");
  CU_EXPECT(cuMemAddressFree(va, granule));
}

TEST_F(vmm_death, TouchingMappedMemoryWithoutAccessFaults) {
  CUdeviceptr va = 0;
  CU_ASSERT(cuMemAddressReserve(&va, granule, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, granule, &prop, 0));
  CU_ASSERT(cuMemMap(va, granule, 0, h, 0));
  EXPECT_DEATH(touch(va), "");
  const CUmemAccessDesc rw = access(0);
  CU_ASSERT(cuMemSetAccess(va, granule, &rw, 1));
  touch(va);  // now it may
  const CUmemAccessDesc none = access(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_ASSERT(cuMemSetAccess(va, granule, &none, 1));
  EXPECT_DEATH(touch(va), "");
  CU_EXPECT(cuMemUnmap(va, granule));
  CU_EXPECT(cuMemRelease(h));
  CU_EXPECT(cuMemAddressFree(va, granule));
}

TEST_F(vmm_death, TouchingUnmappedMemoryFaults) {
  mapped_range range(granule);
  touch(range.ptr());
  CU_ASSERT(cuMemUnmap(range.ptr(), granule));
  EXPECT_DEATH(touch(range.ptr()), "");
  CU_EXPECT(cuMemRelease(range.handle()));
  CU_EXPECT(cuMemAddressFree(range.ptr(), granule));
  range.disown();
}

}  // namespace
}  // namespace tagmem::emu::test
