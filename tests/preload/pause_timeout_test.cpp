// pause_timeout_test.cpp — a pause or resume never waits for the device past its timeout.
//
// A kernel waiting for a peer that died never ends; here slow copies stand in for it (the
// emulator's copy speed limit). Pause must give TIMEOUT while that work still runs, with every
// buffer resident and intact and nothing copied or released; once the work ends, pause and
// resume work again and every byte is there.
#include <gtest/gtest.h>

#include <cstring>

#include "nccl_way.hpp"
#include "peer.hpp"

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

bool mentions(const char* text, const char* part) { return std::strstr(text, part) != nullptr; }

class PauseTimeout : public ::testing::Test {
 protected:
  void SetUp() override {
    use_device(0);
    ASSERT_EQ(nccl().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    emu_set_copy_bytes_per_second(0);
    nccl().cuStreamDestroy(stream_);  // waits for what is left
  }
  CUstream stream_ = nullptr;
};

TEST_F(PauseTimeout, StalledDeviceWorkGivesTimeoutAndLeavesEverythingResidentAndIntact) {
  filled mine(0, 0x7170, 4 * MiB, 3);
  // Device work that takes many times the timeout: 16 copies rewriting the bytes buffer 0
  // already holds, 2 MiB each at 2 MiB/s.
  emu_set_copy_bytes_per_second(2 * MiB);
  for (int i = 0; i < 16; ++i) {
    std::size_t half = (i % 2) * 2 * MiB;
    ASSERT_EQ(nccl().cuMemcpyHtoDAsync(mine.buffers[0].va + half, mine.bytes[0].data() + half,
                                       2 * MiB, stream_),
              CUDA_SUCCESS);
  }
  std::string group = unique_group("stall");
  tagmem_status st = shim().pause(group.c_str(), 0, 1, 300);
  EXPECT_EQ(st, TAGMEM_ERROR_TIMEOUT) << shim().last_error();
  EXPECT_TRUE(mentions(shim().last_error(), "did not finish its work within 300 ms"))
      << shim().last_error();
  EXPECT_EQ(nccl().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY)
      << "pause returned before the device work ended";
  tagmem_nccl_stats s = shim_stats();
  EXPECT_EQ(s.paused, 0);
  EXPECT_EQ(s.released_bytes, 0u);
  EXPECT_EQ(s.backup_bytes, 0u);
  EXPECT_EQ(s.resident_bytes, s.held_bytes);
  EXPECT_EQ(s.backup_store_used_bytes, 0u) << "nothing was copied";
  EXPECT_TRUE(mine.all_readable()) << "every buffer resident";

  emu_set_copy_bytes_per_second(0);  // the device work can end now
  EXPECT_TRUE(mine.intact()) << "every byte in place";
  ASSERT_EQ(shim().pause(group.c_str(), 0, 1, 20000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(nccl().cuStreamQuery(stream_), CUDA_SUCCESS) << "pause waited for the device";
  EXPECT_TRUE(mine.none_readable());
  ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 20000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
}

TEST_F(PauseTimeout, BackupCopiesOutlivingTheTimeoutKeepTheirHostMemoryUntilTheyEnd) {
  filled mine(0, 0x7180, 2 * MiB, 3);
  emu_set_copy_bytes_per_second(1 * MiB);  // each backup copy takes two seconds
  std::string group = unique_group("slowbackup");
  tagmem_status st = shim().pause(group.c_str(), 0, 1, 300);
  EXPECT_EQ(st, TAGMEM_ERROR_TIMEOUT) << shim().last_error();
  EXPECT_TRUE(mentions(shim().last_error(), "copies on device 0 did not finish within 300 ms"))
      << shim().last_error();
  tagmem_nccl_stats s = shim_stats();
  EXPECT_EQ(s.paused, 0);
  EXPECT_EQ(s.released_bytes, 0u);
  EXPECT_EQ(s.backup_bytes, 0u) << "no record keeps a backup of a failed pause";
  EXPECT_GT(s.backup_store_used_bytes, 0u) << "host memory a copy still writes is not reused";
  EXPECT_TRUE(mine.all_readable());

  emu_set_copy_bytes_per_second(0);
  EXPECT_TRUE(mine.intact());
  ASSERT_EQ(shim().pause(group.c_str(), 0, 1, 20000), TAGMEM_SUCCESS) << shim().last_error();
  s = shim_stats();
  EXPECT_EQ(s.backup_bytes, 6 * MiB);
  EXPECT_EQ(s.backup_store_used_bytes, s.backup_bytes) << "the late copies' memory came back";
  ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 20000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(shim_stats().backup_store_used_bytes, 0u);
}

TEST_F(PauseTimeout, RefillOutlivingTheTimeoutLeavesThePauseInPlaceAndARetryResumes) {
  const std::uint64_t allocations_before = emu_live_allocations();
  filled mine(0, 0x7190, 2 * MiB, 3);
  std::string group = unique_group("slowrefill");
  ASSERT_EQ(shim().pause(group.c_str(), 0, 1, 20000), TAGMEM_SUCCESS) << shim().last_error();
  emu_set_copy_bytes_per_second(1 * MiB);  // each refill copy takes two seconds
  tagmem_status st = shim().resume(group.c_str(), 0, 1, 300);
  EXPECT_EQ(st, TAGMEM_ERROR_TIMEOUT) << shim().last_error();
  tagmem_nccl_stats s = shim_stats();
  EXPECT_EQ(s.paused, 1) << "still paused, with every backup";
  EXPECT_EQ(s.backup_bytes, 6 * MiB);
  EXPECT_EQ(s.released_bytes, 6 * MiB);

  emu_set_copy_bytes_per_second(0);
  ASSERT_EQ(shim().resume(group.c_str(), 0, 1, 20000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  s = shim_stats();
  EXPECT_EQ(s.backup_bytes, 0u);
  EXPECT_EQ(s.backup_store_used_bytes, 0u);
  EXPECT_EQ(emu_live_allocations(), allocations_before + 3)
      << "the refill abandoned at the timeout was undone";
}

}  // namespace
}  // namespace tagmem::preload_test
