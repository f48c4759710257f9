// pause_faults_test.cpp — a driver call failing in the middle of a pause leaves every buffer
// whole: each one either mapped at all its addresses with its bytes, or released with its
// backup, and a retry brings every byte back without leaking the backup.
#include <gtest/gtest.h>

#include <cstring>

#include "nccl_way.hpp"
#include "peer.hpp"

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

bool mentions(const char* text, const char* part) { return std::strstr(text, part) != nullptr; }

// Brings a group of one back to resident after a failed call, as a caller would: resume if
// the stats say paused, else pause and resume again.
void recover_alone(const std::string& group) {
  if (shim_stats().paused) {
    ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 10000), TAGMEM_SUCCESS) << shim().last_error();
    return;
  }
  ASSERT_EQ(shim().pause(group.c_str(), 0, 1, 10000), TAGMEM_SUCCESS) << shim().last_error();
  ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 10000), TAGMEM_SUCCESS) << shim().last_error();
}

TEST(PauseFaults, FailedUnmapOfASecondMappingLeavesTheBufferWholeAndItsBackupIsNotLeaked) {
  use_device(0);
  buffer b = create_buffer(0, 4 * MiB, false);
  buffer again = second_mapping(b, 0);
  const std::vector<unsigned char> bytes = pattern(0x5eed01, b.size);
  write_bytes(b, 0, bytes);
  std::string group = unique_group("unmap");

  // The buffer's first address unmaps, its second does not.
  emu_fail_call("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN);
  tagmem_status st = shim().pause(group.c_str(), 0, 1, 10000);
  emu_clear_faults();
  use_device(0);
  EXPECT_EQ(st, TAGMEM_ERROR_DRIVER);
  EXPECT_TRUE(mentions(shim().last_error(), "cuMemUnmap")) << shim().last_error();
  EXPECT_EQ(readable(b.va), readable(again.va))
      << "a buffer is mapped at all its addresses or none";
  if (readable(again.va)) {
    EXPECT_EQ(read_bytes(again, 0, b.size), bytes);
  }
  tagmem_nccl_stats s = shim_stats();
  EXPECT_EQ(s.held_bytes, s.resident_bytes + s.released_bytes);
  EXPECT_EQ(s.backup_bytes, s.released_bytes) << "a backup exactly for what is released";

  recover_alone(group);
  ASSERT_TRUE(readable(b.va) && readable(again.va)) << "resumed: mapped at both addresses";
  EXPECT_EQ(read_bytes(b, 0, b.size), bytes);
  EXPECT_EQ(read_bytes(again, 0, b.size), bytes);
  s = shim_stats();
  EXPECT_EQ(s.paused, 0);
  EXPECT_EQ(s.backup_bytes, 0u);
  EXPECT_EQ(s.released_bytes, 0u);

  // A clean cycle afterwards: nothing left over from the failed one.
  ASSERT_EQ(shim().pause(group.c_str(), 0, 1, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(shim_stats().backup_bytes, b.size);
  ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(read_bytes(again, 0, b.size), bytes);
  EXPECT_EQ(shim_stats().backup_bytes, 0u);

  free_second_mapping(again);
  free_buffer(b);
  EXPECT_EQ(shim_stats().allocations, 0u);
}

}  // namespace
}  // namespace tagmem::preload_test
