// release_test.cpp — DISCARD offloads release physical memory in the background (Note
// [background release]): tagmem_wait_released hands it all back, an allocation that needs it
// waits for it instead of failing, a release that fails is reported and retried, and
// TAGMEM_DISCARD_RELEASE=wait releases before the offload returns. A swap's out-side goes the
// same way unless TAGMEM_SWAP_RELEASE=inline. The Release suite runs on both drivers;
// EmulatorRelease uses fault injection and the emulated device size.
#include <algorithm>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

using Release = tagmem_test;

std::size_t pending_bytes() {
  tagmem_device_stats ds{};
  EXPECT_EQ(tagmem_device_stats_get(0, &ds), TAGMEM_SUCCESS) << tagmem_last_error();
  return ds.release_pending_bytes;
}

std::size_t mapped_bytes(const char* tag) {
  tagmem_tag_stats s{};
  EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.mapped_bytes;
}

// One allocation of `bytes` in `tag` whose first and last MiB (all of it when smaller) are
// written with random bytes and read back: the memory is really there and usable.
void* allocate_filled(std::mt19937_64& rng, const char* tag, std::size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(tagmem_malloc_tagged(&p, bytes, tag, 0, nullptr), TAGMEM_SUCCESS)
      << tag << ": " << tagmem_last_error();
  if (!p) return nullptr;
  const std::size_t window = std::min<std::size_t>(bytes, 1u << 20);
  for (std::size_t at : {std::size_t{0}, bytes - window}) {
    auto data = random_bytes(rng, window);
    void* q = static_cast<char*>(p) + at;
    write_device(q, data.data(), window);
    EXPECT_EQ(read_device(q, window), data) << tag << " at " << at;
  }
  return p;
}

// What tagmem_init returns after a shutdown with `env`=`value` (restart_with_env for a setting
// that must be taken).
tagmem_status init_status_with(const char* env, const char* value) {
  EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  scoped_env set(env, value);
  return tagmem_init(nullptr);
}

TEST_F(Release, WaitReleasedGivesBackEveryDiscardedByte) {
  auto rng = rng_for_test();
  std::vector<void*> kv;
  for (int i = 0; i < 8; ++i) kv.push_back(allocate_filled(rng, "kv_cache", 64u << 20));
  const std::size_t mapped = mapped_bytes("kv_cache");
  TAGMEM_OK(tagmem_wait_released(0));  // nothing pending: returns at once
  const std::size_t free_before = device_free_bytes();
  const char* tags[] = {"kv_cache"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
  EXPECT_EQ(mapped_bytes("kv_cache"), 0u);
  EXPECT_LE(pending_bytes(), mapped);
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_EQ(pending_bytes(), 0u);
  EXPECT_GE(device_free_bytes(), free_before + mapped);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  for (void* p : kv) {  // usable again at the same addresses
    auto data = random_bytes(rng, 64u << 20);
    write_device(p, data.data(), data.size());
    EXPECT_EQ(read_device(p, data.size()), data);
    TAGMEM_OK(tagmem_free(p, nullptr));
  }
}

// Most of the device in one tag, discarded, then the same amount asked for by another tag at
// once: the allocation must get the memory the background thread is still handing back.
TEST_F(Release, AllocationRightAfterADiscardGetsItsMemory) {
  auto rng = rng_for_test();
  std::size_t limit = 0;
  if (using_emulator()) {
    limit = emulator().device_bytes(0);
    const std::size_t used = limit - device_free_bytes();
    ASSERT_EQ(emulator().set_device_bytes(0, used + (160u << 20)), 0);
  }
  const std::size_t chunk = 2u << 20;
  const std::size_t bytes = device_free_bytes() / 10 * 7 / chunk * chunk;
  void* big = allocate_filled(rng, "engine_kv", bytes);
  ASSERT_NE(big, nullptr);
  const char* tags[] = {"engine_kv"};
  for (int round = 0; round < 3; ++round) {
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
    void* other = allocate_filled(rng, "trainer", bytes);  // only fits once released
    ASSERT_NE(other, nullptr) << "round " << round;
    TAGMEM_OK(tagmem_free(other, nullptr));
    TAGMEM_OK(tagmem_empty_cache(0));
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
  }
  TAGMEM_OK(tagmem_free(big, nullptr));
  if (limit) {
    ASSERT_EQ(emulator().set_device_bytes(0, limit), 0);
  }
}

// The two sides of a phase switch, each `count` random-filled allocations of `bytes`: the engine
// offloaded with BACKUP (its memory back with the driver), then the trainer resident.
const char* eng[] = {"engine"};
const char* trn[] = {"trainer"};
struct sides {
  std::vector<filled> engine, trainer;
};
sides engine_out_trainer_in(std::mt19937_64& rng, int count, std::size_t bytes) {
  sides s;
  s.engine = fill(rng, "engine", count, bytes);
  EXPECT_EQ(tagmem_offload(eng, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  s.trainer = fill(rng, "trainer", count, bytes);
  return s;
}

// A swap's out-side memory goes back through the release queue after the swap's copies
// (TAGMEM_SWAP_RELEASE=background, the default) or before the swap returns (inline); with either,
// every byte of both sides survives swaps both ways.
void swap_both_ways_keeps_every_byte(const char* swap_release) {
  restart_with_env("TAGMEM_SWAP_RELEASE", swap_release);
  const bool background = std::string(swap_release) == "background";
  auto rng = rng_for_test();
  auto [engine, trainer] = engine_out_trainer_in(rng, 4, 24u << 20);
  const std::size_t trainer_mapped = mapped_bytes("trainer");
  for (int round = 0; round < 2; ++round) {
    TAGMEM_OK(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(engine), 0u) << "engine after the swap in";
    EXPECT_EQ(mapped_bytes("trainer"), 0u);
    if (background) {
      EXPECT_LE(pending_bytes(), trainer_mapped);
    } else {
      EXPECT_EQ(pending_bytes(), 0u) << "an inline swap releases before it returns";
    }
    TAGMEM_OK(tagmem_wait_released(0));
    EXPECT_EQ(pending_bytes(), 0u);
    TAGMEM_OK(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(trainer), 0u) << "trainer after the swap back";
  }
  TAGMEM_OK(tagmem_reload(eng, 1, 0));
  EXPECT_EQ(corrupted(engine), 0u) << "engine reloaded";
  free_all(engine);
  free_all(trainer);
}

TEST_F(Release, SwapWithBackgroundReleaseKeepsEveryByteAndGivesTheMemoryBack) {
  swap_both_ways_keeps_every_byte("background");
}

TEST_F(Release, SwapWithInlineReleaseKeepsEveryByteAndReleasesBeforeReturning) {
  swap_both_ways_keeps_every_byte("inline");
}

TEST_F(Release, BadSwapReleaseSettingIsRejectedAtInit) {
  EXPECT_EQ(init_status_with("TAGMEM_SWAP_RELEASE", "later"), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("TAGMEM_SWAP_RELEASE"), std::string::npos);
  TAGMEM_OK(tagmem_init(nullptr));  // for TearDown
}

class EmulatorRelease : public tagmem_test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    tagmem_test::SetUp();
    if (emulator().available) limit_ = emulator().device_bytes(0);
  }
  void TearDown() override {
    if (emulator().available) emulator().set_device_bytes(0, limit_);
    tagmem_test::TearDown();
  }
  std::size_t limit_ = 0;
};

TEST_F(EmulatorRelease, FailedReleaseIsReportedAndRetried) {
  auto rng = rng_for_test();
  std::vector<void*> kv;
  for (int i = 0; i < 4; ++i) kv.push_back(allocate_filled(rng, "kv_cache", 32u << 20));
  tagmem_tag_stats resident{};
  TAGMEM_OK(tagmem_tag_stats_get("kv_cache", 0, &resident));
  ASSERT_EQ(resident.mappings, 4u) << "each 32 MiB allocation has a segment of its own";
  // Calls 1 to 4 release the four mappings (on the release thread, or in the wait if it comes
  // first); the first fails. The wait tries each failed handle up to twice: in the first order,
  // call 5 retries that one and fails, and call 6 fails again; in the second, call 2 succeeds at
  // once, and calls 5 and 6 fail the fourth mapping. Either way one mapping is left.
  const std::uint64_t releases = emulator().call_count("cuMemRelease");
  for (std::uint64_t nth : {1, 5, 6}) {
    ASSERT_EQ(emulator().fail_call("cuMemRelease", nth, CUDA_ERROR_UNKNOWN), 0);
  }
  const char* tags[] = {"kv_cache"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));  // unmapped: the offload succeeded
  TAGMEM_FAILS_WITH(tagmem_wait_released(0), TAGMEM_ERROR_DRIVER);
  EXPECT_NE(std::string(tagmem_last_error()).find("cuMemRelease"), std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(pending_bytes(), resident.mapped_bytes / 4) << "one of four mappings is still held";
  TAGMEM_OK(tagmem_wait_released(0));  // the retry succeeds
  EXPECT_EQ(pending_bytes(), 0u);
  EXPECT_EQ(emulator().call_count("cuMemRelease"), releases + 7);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  for (void* p : kv) TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(EmulatorRelease, AllocationWaitsForAReleaseThatFailedOnce) {
  auto rng = rng_for_test();
  const std::size_t used = limit_ - device_free_bytes();
  ASSERT_EQ(emulator().set_device_bytes(0, used + (64u << 20)), 0);
  void* kv = allocate_filled(rng, "kv_cache", 48u << 20);
  ASSERT_EQ(emulator().fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN), 0);
  const char* tags[] = {"kv_cache"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
  // Still held: the first release attempt fails (on the release thread, or in the allocation's
  // wait); the allocation runs out of memory, waits for the queue, whose retry succeeds, and
  // tries again.
  void* other = allocate_filled(rng, "trainer", 48u << 20);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(pending_bytes(), 0u);
  TAGMEM_OK(tagmem_free(other, nullptr));
  TAGMEM_OK(tagmem_empty_cache(0));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_free(kv, nullptr));
}

TEST_F(EmulatorRelease, WaitModeReleasesBeforeTheOffloadReturns) {
  restart_with_env("TAGMEM_DISCARD_RELEASE", "wait");
  auto rng = rng_for_test();
  void* kv = allocate_filled(rng, "kv_cache", 32u << 20);
  const std::uint64_t releases = emulator().call_count("cuMemRelease");
  const char* tags[] = {"kv_cache"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
  EXPECT_EQ(emulator().call_count("cuMemRelease"), releases + 1);
  EXPECT_EQ(pending_bytes(), 0u);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_free(kv, nullptr));
}

TEST_F(EmulatorRelease, BadSettingIsRejectedAtInit) {
  EXPECT_EQ(init_status_with("TAGMEM_DISCARD_RELEASE", "later"), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("TAGMEM_DISCARD_RELEASE"), std::string::npos);
  TAGMEM_OK(tagmem_init(nullptr));  // for TearDown
}

// A swap where the in-side fits only once the out-side's memory is back with the driver: with
// TAGMEM_SWAP_RELEASE=background that memory is still queued when the in-runs are mapped, so
// mapping must wait for the queue instead of failing. Recycling is off, or the in-side would map
// the out-side's handles directly and never need the queue.
TEST_F(EmulatorRelease, TightSwapWithBackgroundReleaseWaitsForTheOutgoingMemory) {
  scoped_env no_recycling("TAGMEM_RECYCLE_PHYSICAL", "off");
  restart_with_env("TAGMEM_SWAP_RELEASE", "background");
  auto rng = rng_for_test();
  auto [engine, trainer] = engine_out_trainer_in(rng, 3, 16u << 20);
  const std::size_t used = limit_ - device_free_bytes();
  ASSERT_EQ(emulator().set_device_bytes(0, used + (16u << 20)), 0);
  for (int round = 0; round < 2; ++round) {
    TAGMEM_OK(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(engine), 0u) << "engine after the swap in";
    TAGMEM_OK(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(trainer), 0u) << "trainer after the swap back";
  }
  free_all(trainer);
  TAGMEM_OK(tagmem_empty_cache(0));
  ASSERT_EQ(emulator().set_device_bytes(0, limit_), 0);
  TAGMEM_OK(tagmem_reload(eng, 1, 0));
  EXPECT_EQ(corrupted(engine), 0u) << "engine reloaded";
  free_all(engine);
}

// A swap hands its out-side to the release queue (the default, TAGMEM_SWAP_RELEASE=background);
// a release there that fails does not fail the swap, whose copies are done and whose bytes are
// safe: tagmem_wait_released reports it, the retry gives the memory back, and both sides
// survive the swap back. Recycling is off: with it, the in-side maps whichever out-side handles
// are unmapped by the time it maps, so how many reach the queue (none, one or two) would depend
// on the copy threads' timing.
TEST_F(EmulatorRelease, FailedReleaseAfterASwapIsReportedAndRetried) {
  restart_with_env("TAGMEM_RECYCLE_PHYSICAL", "off");
  auto rng = rng_for_test();
  auto [engine, trainer] = engine_out_trainer_in(rng, 2, 16u << 20);
  tagmem_tag_stats resident{};
  TAGMEM_OK(tagmem_tag_stats_get("trainer", 0, &resident));
  ASSERT_EQ(resident.mappings, 2u) << "each 16 MiB allocation has a segment of its own";
  // Calls 1 to 4 fail. If the release thread comes first it fails both mappings (calls 1, 2)
  // and the wait, which tries each failed handle twice, fails the first again (3, 4) and
  // releases the second (5); if the wait comes first it fails both twice (1 to 4). Either way
  // the wait reports the failure and keeps at least one mapping, and the next wait releases
  // what is left: six calls in all.
  const std::uint64_t releases = emulator().call_count("cuMemRelease");
  for (std::uint64_t nth : {1, 2, 3, 4}) {
    ASSERT_EQ(emulator().fail_call("cuMemRelease", nth, CUDA_ERROR_UNKNOWN), 0);
  }
  TAGMEM_OK(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
  EXPECT_EQ(corrupted(engine), 0u) << "engine after the swap in";
  TAGMEM_FAILS_WITH(tagmem_wait_released(0), TAGMEM_ERROR_DRIVER);
  EXPECT_NE(std::string(tagmem_last_error()).find("cuMemRelease"), std::string::npos)
      << tagmem_last_error();
  EXPECT_GT(pending_bytes(), 0u) << "the handle whose release failed is still held";
  TAGMEM_OK(tagmem_wait_released(0));  // the retry succeeds
  EXPECT_EQ(pending_bytes(), 0u);
  EXPECT_EQ(emulator().call_count("cuMemRelease"), releases + 6);
  TAGMEM_OK(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP));
  EXPECT_EQ(corrupted(trainer), 0u) << "trainer after the swap back";
  TAGMEM_OK(tagmem_wait_released(0));
  free_all(trainer);
  TAGMEM_OK(tagmem_reload(eng, 1, 0));
  EXPECT_EQ(corrupted(engine), 0u) << "engine reloaded";
  free_all(engine);
}

// An offload whose cuMemRelease fails gives up and maps its tags back (Note [unmap as copied]);
// on a device with no room to spare that needs the very memory whose release failed. The handle
// waits in the release queue (Note [release later]), and the restore's cuMemCreate, out of
// memory, drains it: every tag ends resident with its bytes.
TEST_F(EmulatorRelease, FailedReleaseInAnOffloadOnAFullDeviceStillLeavesEveryTagResident) {
  auto rng = rng_for_test();
  const char* tags[] = {"t0", "t1"};
  auto t0 = fill(rng, "t0", 2, 16u << 20);
  auto t1 = fill(rng, "t1", 2, 16u << 20);
  const std::size_t used = limit_ - device_free_bytes();
  ASSERT_EQ(emulator().set_device_bytes(0, used + (2u << 20)), 0);
  ASSERT_EQ(emulator().fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN), 0);
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP), TAGMEM_ERROR_DRIVER);
  EXPECT_NE(std::string(tagmem_last_error()).find("cuMemRelease"), std::string::npos)
      << tagmem_last_error();
  for (const char* name : tags) {
    tagmem_tag_stats s{};
    TAGMEM_OK(tagmem_tag_stats_get(name, 0, &s));
    EXPECT_EQ(s.state, TAGMEM_RESIDENT) << name;
    EXPECT_EQ(s.host_bytes, 0u) << name << ": no backup kept for a resident tag";
  }
  EXPECT_EQ(corrupted(t0), 0u) << "t0 after the failed offload";
  EXPECT_EQ(corrupted(t1), 0u) << "t1 after the failed offload";
  EXPECT_EQ(pending_bytes(), 0u);
  TAGMEM_OK(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP));  // the fault is gone: it works
  TAGMEM_OK(tagmem_reload(tags, 2, 0));
  EXPECT_EQ(corrupted(t0), 0u) << "t0 after offload and reload";
  EXPECT_EQ(corrupted(t1), 0u) << "t1 after offload and reload";
  free_all(t0);
  free_all(t1);
}

// The same failure, but mapping the tag back fails too: nothing of it is mapped, every byte is in
// its backup, and it is plainly offloaded (a fuzzer finding: it was left "partly offloaded", so a
// second offload succeeded where an offloaded tag's is TAG_OFFLOADED).
TEST_F(EmulatorRelease, TagWhoseFailedOffloadCouldNotBeUndoneIsPlainlyOffloaded) {
  auto rng = rng_for_test();
  const char* tags[] = {"t0"};
  auto t0 = fill(rng, "t0", 1, 16u << 20);
  ASSERT_EQ(emulator().fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN), 0);
  ASSERT_EQ(emulator().fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN), 0);
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_DRIVER);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("t0", 0, &s));
  EXPECT_EQ(s.state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(s.mapped_bytes, 0u);
  EXPECT_EQ(s.host_bytes, 16u << 20);
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_TAG_OFFLOADED);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(t0), 0u) << "t0 reloaded";
  free_all(t0);
}

}  // namespace
}  // namespace tagmem::test
