// nccl_tag_test.cpp — NCCL's memory is the tag "nccl" to tagmem's own calls, and its backups
// live in tagmem's one pinned host store.
//
// One rank pauses and resumes buffers with random bytes, created the way NCCL creates them;
// around that, tagmem's C ABI must list the tag, count its bytes where they are (device,
// backup), count the backups in the host store's figures, give the pinned pages back to
// tagmem_host_trim once resumed, refuse to move the tag with tagmem_offload and its kin, and
// refuse tagmem_shutdown while the backups are in the store. NcclTagSlab runs in a process of
// its own with TAGMEM_HOST_SLAB_BYTES set: the store NCCL's backups grow must be that size.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "nccl_way.hpp"
#include "peer.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

template <class F>
F core_fn(const char* name) {
  void* f = dlsym(RTLD_DEFAULT, name);
  if (!f) ADD_FAILURE() << name << " not found: run under LD_PRELOAD=libtagmem_preload.so";
  return reinterpret_cast<F>(f);
}

tagmem_tag_stats tag_stats(const char* name) {
  tagmem_tag_stats s{};
  auto get = core_fn<decltype(&tagmem_tag_stats_get_sized)>("tagmem_tag_stats_get_sized");
  EXPECT_EQ(get(name, 0, &s, sizeof s), TAGMEM_SUCCESS) << shim().last_error();
  return s;
}

tagmem_device_stats device_stats() {
  tagmem_device_stats s{};
  auto get = core_fn<decltype(&tagmem_device_stats_get_sized)>("tagmem_device_stats_get_sized");
  EXPECT_EQ(get(0, &s, sizeof s), TAGMEM_SUCCESS) << shim().last_error();
  return s;
}

std::vector<std::string> tags() {
  auto list = core_fn<decltype(&tagmem_list_tags)>("tagmem_list_tags");
  char names[64][TAGMEM_MAX_TAG_NAME + 1];
  std::size_t count = 0;
  EXPECT_EQ(list(0, names, 64, &count), TAGMEM_SUCCESS) << shim().last_error();
  return std::vector<std::string>(names, names + std::min<std::size_t>(count, 64));
}

bool listed(const char* name) {
  std::vector<std::string> all = tags();
  return std::find(all.begin(), all.end(), name) != all.end();
}

tagmem_status trim(std::size_t keep) {
  return core_fn<decltype(&tagmem_host_trim)>("tagmem_host_trim")(keep);
}

bool names_pause(const char* message) {
  return std::strstr(message, "tagmem_nccl_pause") != nullptr &&
         std::strstr(message, "'nccl'") != nullptr;
}

class NcclTag : public ::testing::Test {
 protected:
  void SetUp() override { use_device(0); }
  std::string group_ = unique_group("nccl_tag");
};

TEST_F(NcclTag, IsListedAndCountedWhereItsBytesAre) {
  const tagmem_tag_stats before = tag_stats(TAGMEM_NCCL_TAG);
  const tagmem_device_stats device_before = device_stats();
  filled mine(0, 0x7a67'0001, 4 * MiB, 3);
  const std::size_t bytes = 12 * MiB;

  EXPECT_TRUE(listed(TAGMEM_NCCL_TAG));
  tagmem_tag_stats t = tag_stats(TAGMEM_NCCL_TAG);
  EXPECT_EQ(t.state, TAGMEM_RESIDENT);
  EXPECT_EQ(t.allocated_bytes - before.allocated_bytes, bytes);
  EXPECT_EQ(t.mapped_bytes - before.mapped_bytes, bytes);
  EXPECT_EQ(t.live_allocations - before.live_allocations, 3u);
  EXPECT_EQ(t.host_bytes, 0u);
  tagmem_device_stats d = device_stats();
  EXPECT_EQ(d.allocated_bytes - device_before.allocated_bytes, bytes);
  EXPECT_EQ(d.mapped_bytes - device_before.mapped_bytes, bytes);

  ASSERT_EQ(shim().pause(group_.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  ASSERT_TRUE(mine.none_readable());
  const tagmem_nccl_stats paused = shim_stats();
  t = tag_stats(TAGMEM_NCCL_TAG);
  EXPECT_EQ(t.state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(t.allocated_bytes - before.allocated_bytes, bytes) << "still the tag's";
  EXPECT_EQ(t.mapped_bytes, t.allocated_bytes - paused.released_bytes);
  EXPECT_EQ(t.host_bytes, paused.backup_bytes);
  EXPECT_GE(t.host_bytes, bytes);
  EXPECT_EQ(t.offload_count, before.offload_count + 1);
  EXPECT_EQ(t.bytes_offloaded - before.bytes_offloaded, paused.backup_bytes);
  d = device_stats();
  EXPECT_EQ(d.host_used_bytes - device_before.host_used_bytes, paused.backup_bytes)
      << "the backups are in tagmem's host store";
  EXPECT_GE(d.host_pinned_bytes, d.host_used_bytes);

  ASSERT_EQ(shim().resume(group_.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  t = tag_stats(TAGMEM_NCCL_TAG);
  EXPECT_EQ(t.state, TAGMEM_RESIDENT);
  EXPECT_EQ(t.host_bytes, 0u);
  EXPECT_EQ(t.mapped_bytes - before.mapped_bytes, bytes);
  EXPECT_EQ(t.bytes_reloaded - before.bytes_reloaded, paused.backup_bytes);
}

TEST_F(NcclTag, BackupPagesGoBackToHostTrimOnceResumed) {
  filled mine(0, 0x7a67'0002, 4 * MiB, 3);
  ASSERT_EQ(trim(0), TAGMEM_SUCCESS) << shim().last_error();
  const std::uint64_t emu_before = emu_pinned_host_bytes();
  ASSERT_EQ(device_stats().host_used_bytes, 0u) << "no backup held before the pause";
  ASSERT_EQ(device_stats().host_pinned_bytes, 0u);

  ASSERT_EQ(shim().pause(group_.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  tagmem_device_stats d = device_stats();
  EXPECT_EQ(d.host_used_bytes, shim_stats().backup_bytes);
  EXPECT_GE(d.host_pinned_bytes, d.host_used_bytes);
  EXPECT_EQ(emu_pinned_host_bytes() - emu_before, d.host_pinned_bytes)
      << "what the pause pinned is what the store reports";
  ASSERT_EQ(trim(0), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(device_stats().host_used_bytes, d.host_used_bytes) << "trim keeps what backups hold";

  ASSERT_EQ(shim().resume(group_.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(device_stats().host_used_bytes, 0u);
  ASSERT_EQ(trim(0), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(device_stats().host_pinned_bytes, 0u);
  EXPECT_EQ(emu_pinned_host_bytes(), emu_before) << "the backup pages are unpinned";
}

TEST_F(NcclTag, OffloadReloadSwapAndAllocationAreRefusedNamingThePause) {
  filled mine(0, 0x7a67'0003, 2 * MiB, 2);
  const char* nccl_tag[] = {TAGMEM_NCCL_TAG};
  auto offload = core_fn<decltype(&tagmem_offload)>("tagmem_offload");
  auto reload = core_fn<decltype(&tagmem_reload)>("tagmem_reload");
  auto swap = core_fn<decltype(&tagmem_swap)>("tagmem_swap");
  auto malloc_tagged = core_fn<decltype(&tagmem_malloc_tagged)>("tagmem_malloc_tagged");

  EXPECT_EQ(offload(nccl_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_pause(shim().last_error())) << shim().last_error();
  EXPECT_EQ(reload(nccl_tag, 1, 0), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_pause(shim().last_error())) << shim().last_error();
  EXPECT_EQ(swap(nccl_tag, 1, nullptr, 0, 0, TAGMEM_BACKUP), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_pause(shim().last_error())) << shim().last_error();
  EXPECT_EQ(swap(nullptr, 0, nccl_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_pause(shim().last_error())) << shim().last_error();
  void* p = nullptr;
  EXPECT_EQ(malloc_tagged(&p, 4096, TAGMEM_NCCL_TAG, 0, nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_pause(shim().last_error())) << shim().last_error();
  EXPECT_EQ(p, nullptr);

  EXPECT_TRUE(mine.intact()) << "nothing moved";
  EXPECT_EQ(tag_stats(TAGMEM_NCCL_TAG).state, TAGMEM_RESIDENT);
}

TEST_F(NcclTag, ShutdownWaitsForTheResumeOfItsBackups) {
  filled mine(0, 0x7a67'0004, 2 * MiB, 2);
  ASSERT_EQ(shim().pause(group_.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  auto shutdown = core_fn<decltype(&tagmem_shutdown)>("tagmem_shutdown");
  EXPECT_EQ(shutdown(), TAGMEM_ERROR_TAG_OFFLOADED);
  EXPECT_NE(std::strstr(shim().last_error(), "tagmem_nccl_resume"), nullptr) << shim().last_error();
  EXPECT_EQ(device_stats().host_used_bytes, shim_stats().backup_bytes) << "the store is there";
  ASSERT_EQ(shim().resume(group_.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
}

// In its own process, TAGMEM_HOST_SLAB_BYTES=32MiB (tests/preload/CMakeLists.txt).
TEST(NcclTagSlab, BackupsGrowTheStoreBySlabBytes) {
  use_device(0);
  filled mine(0, 0x7a67'0005, 4 * MiB, 3);
  const std::uint64_t emu_before = emu_pinned_host_bytes();
  const std::string group = unique_group("nccl_slab");
  ASSERT_EQ(shim().pause(group.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(emu_pinned_host_bytes() - emu_before, 32 * MiB) << "one slab of 32 MiB";
  EXPECT_EQ(device_stats().host_pinned_bytes, 32 * MiB);
  ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 30000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  ASSERT_EQ(trim(0), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(emu_pinned_host_bytes(), emu_before);
}

}  // namespace
}  // namespace tagmem::preload_test
