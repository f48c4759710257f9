// interposition_test.cpp — what the shim's dlsym and cuGetProcAddress hand out, and how the
// wrapped driver calls keep handles and records straight (single process).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>

#include "nccl_way.hpp"

extern "C" {
void* tagmem_unlisted_get_proc_address(void);
void* tagmem_unlisted_lookup(const char* name);
void* tagmem_probe_next(void);
void* tagmem_probe_next_versioned(void);
int tagmem_probe_b_only(void);
}

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;
constexpr std::uint64_t kTagBits = 0xffff000000000000ull;
constexpr std::uint64_t kShimHandle = 0x7a67000000000000ull;  // Note [virtual handles]

class Interposition : public ::testing::Test {
 protected:
  void SetUp() override { use_device(0); }
};

TEST_F(Interposition, ListedCallerGetsWrappersAndItsAllocationsAreRecorded) {
  std::uint64_t before = shim_stats().allocations;
  buffer b = create_buffer(0, 2 * MiB, false);
  EXPECT_EQ(b.handle & kTagBits, kShimHandle) << "the handle should be the shim's own";
  EXPECT_EQ(shim_stats().allocations, before + 1);
  free_buffer(b);
  EXPECT_EQ(shim_stats().allocations, before);
}

TEST_F(Interposition, SelfLookupOfCuGetProcAddressAnswersWithTheWrapper) {
  void* driver_own = tagmem_unlisted_get_proc_address();
  ASSERT_NE(driver_own, nullptr);
  EXPECT_NE(reinterpret_cast<void*>(nccl().get_proc_v2), driver_own);
  EXPECT_NE(reinterpret_cast<void*>(nccl().get_proc), driver_own)
      << "cuGetProcAddress(\"cuGetProcAddress\") must not give the driver's function";
  // And what comes through the self-looked-up pointer is wrapped.
  void* create = nullptr;
  CUdriverProcAddressQueryResult st{};
  ASSERT_EQ(nccl().get_proc("cuMemCreate", &create, CUDA_VERSION, 0, &st), CUDA_SUCCESS);
  EXPECT_NE(create, tagmem_unlisted_lookup("cuMemCreate"));
}

TEST_F(Interposition, LegacyFourArgumentCuGetProcAddressIsWrappedToo) {
  using gpa1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto legacy = reinterpret_cast<gpa1>(dlsym(nccl().library, "cuGetProcAddress"));
  ASSERT_NE(legacy, nullptr);
  void* fn = nullptr;
  ASSERT_EQ(legacy("cuMemCreate", &fn, CUDA_VERSION, 0), CUDA_SUCCESS);
  auto create = reinterpret_cast<decltype(&::cuMemCreate)>(fn);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(create(&h, 2 * MiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(h & kTagBits, kShimHandle);
  EXPECT_EQ(nccl().cuMemRelease(h), CUDA_SUCCESS);
  void* missing = nullptr;
  EXPECT_EQ(legacy("cuNoSuchFunction", &missing, CUDA_VERSION, 0), CUDA_ERROR_NOT_FOUND);
}

TEST_F(Interposition, UnlistedLibrariesGetTheDriversOwnFunctions) {
  auto create = reinterpret_cast<decltype(&::cuMemCreate)>(tagmem_unlisted_lookup("cuMemCreate"));
  auto release =
      reinterpret_cast<decltype(&::cuMemRelease)>(tagmem_unlisted_lookup("cuMemRelease"));
  ASSERT_NE(create, nullptr);
  std::uint64_t before = shim_stats().allocations;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(create(&h, 2 * MiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_NE(h & kTagBits, kShimHandle) << "an unlisted caller's allocation is not recorded";
  EXPECT_EQ(shim_stats().allocations, before);
  EXPECT_EQ(release(h), CUDA_SUCCESS);
}

TEST(Dlsym, RtldNextStillSearchesAfterTheRealCaller) {
  using fn = int (*)();
  auto next = reinterpret_cast<fn>(tagmem_probe_next());
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next(), 2) << "dlsym(RTLD_NEXT) from next_probe_a must find next_probe_b's symbol";
  auto next_v = reinterpret_cast<fn>(tagmem_probe_next_versioned());
  ASSERT_NE(next_v, nullptr);
  EXPECT_EQ(next_v(), 2) << "the same through dlvsym";
}

TEST(Dlsym, OtherSymbolsAreTheLinkersOwn) {
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "tagmem_probe_b_only"),
            reinterpret_cast<void*>(&tagmem_probe_b_only));
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere"), nullptr);
  EXPECT_NE(dlerror(), nullptr) << "a failed lookup still sets dlerror()";
}

TEST_F(Interposition, VirtualHandlesBehaveLikeTheDriversHandles) {
  buffer b = create_buffer(0, 4 * MiB, true);
  CUmemGenericAllocationHandle retained = 0;
  ASSERT_EQ(nccl().cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(b.va + MiB)),
            CUDA_SUCCESS);
  EXPECT_EQ(retained, b.handle) << "retain answers with the handle the application holds";
  CUmemAllocationProp prop{};
  ASSERT_EQ(nccl().cuMemGetAllocationPropertiesFromHandle(&prop, b.handle), CUDA_SUCCESS);
  EXPECT_EQ(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(prop.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(nccl().cuMemRelease(retained), CUDA_SUCCESS);
  EXPECT_EQ(nccl().cuMemRelease(b.handle), CUDA_SUCCESS);
  EXPECT_EQ(nccl().cuMemRelease(b.handle), CUDA_ERROR_INVALID_VALUE)
      << "a handle released as often as it was obtained is gone";
  // Still mapped: the mapping keeps the memory, as with the driver.
  auto bytes = pattern(7, MiB);
  write_bytes(b, MiB, bytes);
  EXPECT_EQ(read_bytes(b, MiB, MiB), bytes);
  EXPECT_EQ(nccl().cuMemUnmap(b.va, b.size), CUDA_SUCCESS);
  EXPECT_EQ(nccl().cuMemAddressFree(b.va, b.size), CUDA_SUCCESS);
  EXPECT_EQ(shim_stats().held_bytes, 0u);
}

TEST_F(Interposition, HostLocatedAllocationsPassThrough) {
  std::size_t host_before = shim_stats().host_located_bytes;
  std::uint64_t before = shim_stats().allocations;
  buffer b = create_buffer(0, 2 * MiB, false, /*host_located=*/true);
  EXPECT_NE(b.handle & kTagBits, kShimHandle);
  EXPECT_EQ(shim_stats().allocations, before);
  EXPECT_EQ(shim_stats().host_located_bytes, host_before + 2 * MiB);
  free_buffer(b);
}

TEST_F(Interposition, SingleProcessPauseRefusesNcclWorkAndResumeRestores) {
  buffer b = create_buffer(0, 6 * MiB, true);
  buffer c = classic_buffer(5 * MiB);
  auto bytes_b = pattern(11, b.size), bytes_c = pattern(12, c.size);
  write_bytes(b, 0, bytes_b);
  write_bytes(c, 0, bytes_c);
  ASSERT_EQ(shim().pause("single", 0, 1, 5000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_FALSE(readable(b.va));
  EXPECT_FALSE(readable(c.va));
  int fd = -1;
  EXPECT_EQ(nccl().cuMemExportToShareableHandle(&fd, b.handle,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_NOT_PERMITTED)
      << "exporting released memory is refused";
  EXPECT_EQ(shim().pause("single", 0, 1, 5000), TAGMEM_ERROR_TAG_OFFLOADED);
  ASSERT_EQ(shim().resume("single", 0, 1, 5000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(shim().resume("single", 0, 1, 5000), TAGMEM_ERROR_TAG_RESIDENT);
  EXPECT_EQ(read_bytes(b, 0, b.size), bytes_b);
  EXPECT_EQ(read_bytes(c, 0, c.size), bytes_c);
  free_buffer(b);
  free_buffer(c);
}

TEST_F(Interposition, BuffersFreedWhilePausedLeaveNothingBehind) {
  std::uint64_t allocations = emu_live_allocations();
  buffer b = create_buffer(0, 2 * MiB, false);
  buffer c = classic_buffer(2 * MiB);
  ASSERT_EQ(shim().pause("single", 0, 1, 5000), TAGMEM_SUCCESS) << shim().last_error();
  free_buffer(b);  // NCCL tearing a communicator down while paused
  free_buffer(c);
  EXPECT_EQ(shim_stats().allocations, 0u);
  EXPECT_EQ(shim_stats().backup_bytes, 0u) << "the backup of freed buffers is given back";
  ASSERT_EQ(shim().resume("single", 0, 1, 5000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(emu_live_allocations(), allocations);
}

TEST(Arguments, BadGroupRankOrSizeAreInvalidArguments) {
  EXPECT_EQ(shim().pause("bad name!", 0, 1, 1000), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(shim().last_error(), "group name"), nullptr) << shim().last_error();
  EXPECT_EQ(shim().pause("g", 2, 2, 1000), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(shim().pause("g", 0, 0, 1000), TAGMEM_ERROR_INVALID_ARGUMENT)
      << "size 0 means LOCAL_WORLD_SIZE, which is not set here";
  EXPECT_EQ(shim().pause("g", 0, 1, -5), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(shim().stats(nullptr, sizeof(tagmem_nccl_stats)), TAGMEM_ERROR_INVALID_ARGUMENT);
  // A size no tagmem_nccl_stats ever had writes nothing (docs/abi.md).
  tagmem_nccl_stats s;
  std::memset(&s, 0x5a, sizeof s);
  EXPECT_EQ(shim().stats(&s, 8), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(s.held_bytes, static_cast<std::size_t>(0x5a5a5a5a5a5a5a5aull));
}

}  // namespace
}  // namespace tagmem::preload_test
