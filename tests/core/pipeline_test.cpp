// pipeline_test.cpp — the copy pipeline's promises under failure and under memory pressure,
// shown on the emulated driver (fault injection, call counts, device size and copy speed are
// emulator controls): a copy that fails before or after unmapping began leaves every tag
// resident; a swap whose in-tags fit only once the out-tags are gone succeeds; a swap whose
// in-tag cannot fit still offloads, and one whose in-tags wait for the out-tags copies them in
// order; copies do not grow with the number of allocations; the host store pins in the
// background and trims. Excluded from the GPU run by suite name (Emulator*).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "test_support.hpp"
#include "trace_events.hpp"

namespace tagmem::test {
namespace {

// tagmem with 1 MiB copies, so that small tags still make many pieces; restores the emulator.
class EmulatorPipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    tagmem_config cfg;
    tagmem_config_init(&cfg);
    cfg.copy_piece_bytes = 1u << 20;
    ASSERT_EQ(tagmem_init(&cfg), TAGMEM_SUCCESS) << tagmem_last_error();
    ASSERT_TRUE(emulator().fail_call && emulator().call_count && emulator().set_device_bytes &&
                emulator().set_copy_bytes_per_second);
    device_bytes_ = emulator().device_bytes(0);
  }
  void TearDown() override {
    if (!emulator().available) return;  // SetUp failed the test
    emulator().clear_faults();
    emulator().set_copy_bytes_per_second(0);
    emulator().set_device_bytes(0, device_bytes_);
    EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  }

  // `count` allocations of `size` bytes of random data in `tag`.
  std::vector<filled> fill(const char* tag, int count, std::size_t size) {
    return test::fill(rng_, tag, count, size);
  }
  static tagmem_tag_stats stats(const char* tag) {
    tagmem_tag_stats s{};
    EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
    return s;
  }

  std::mt19937_64 rng_ = rng_for_test();
  std::uint64_t device_bytes_ = 0;
};

TEST_F(EmulatorPipeline, CopyQueueFailureLeavesEveryTagResident) {
  auto a = fill("a", 40, 512 << 10);
  auto b = fill("b", 10, 3 << 20);
  tagmem_tag_stats before = stats("b");
  emulator().fail_call("cuMemcpyDtoHAsync", 15, CUDA_ERROR_UNKNOWN);
  const char* tags[] = {"a", "b"};
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP), TAGMEM_ERROR_DRIVER);
  EXPECT_EQ(stats("a").state, TAGMEM_RESIDENT);
  EXPECT_EQ(stats("b").state, TAGMEM_RESIDENT);
  EXPECT_EQ(stats("b").mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(corrupted(a) + corrupted(b), 0u);
  tagmem_device_stats ds{};
  TAGMEM_OK(tagmem_device_stats_get(0, &ds));
  EXPECT_EQ(ds.host_used_bytes, 0u) << "host extents of a failed offload must go back";
  TAGMEM_OK(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 2, 0));
  EXPECT_EQ(corrupted(a) + corrupted(b), 0u);
}

TEST_F(EmulatorPipeline, CopyFailureAfterUnmappingBeganRestoresTheTags) {
  auto a = fill("a", 24, 1 << 20);  // 12 chunks of 2 MiB, 24 one-MiB copies
  auto b = fill("b", 4, 4 << 20);
  emulator().set_copy_bytes_per_second(200u << 20);  // ~5 ms per copy: the loop waits on events
  std::uint64_t unmaps = emulator().call_count("cuMemUnmap");
  emulator().fail_call("cuEventSynchronize", 8, CUDA_ERROR_LAUNCH_FAILED);
  const char* tags[] = {"a", "b"};
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP), TAGMEM_ERROR_DRIVER);
  emulator().set_copy_bytes_per_second(0);
  ASSERT_GT(emulator().call_count("cuMemUnmap"), unmaps) << "unmapping had not begun";
  EXPECT_EQ(stats("a").state, TAGMEM_RESIDENT);
  EXPECT_EQ(stats("b").state, TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(a) + corrupted(b), 0u);
  tagmem_device_stats ds{};
  TAGMEM_OK(tagmem_device_stats_get(0, &ds));
  EXPECT_EQ(ds.host_used_bytes, 0u);
  TAGMEM_OK(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 2, 0));
  EXPECT_EQ(corrupted(a) + corrupted(b), 0u);
}

TEST_F(EmulatorPipeline, SwapSucceedsWhenInTagsFitOnlyAfterOutTagsLeave) {
  auto engine = fill("engine", 6, 8 << 20);  // 48 MiB in 3 medium segments of 20 MiB
  const std::size_t engine_bytes = stats("engine").mapped_bytes;
  const char* engine_tag[] = {"engine"};
  TAGMEM_OK(tagmem_offload(engine_tag, 1, 0, TAGMEM_BACKUP));
  auto trainer = fill("trainer", 40, 1 << 20);  // 40 MiB in 2 MiB chunks
  auto optimizer = fill("optimizer", 2, 12 << 20);
  // Shrink the device so that the engine fits only once most of the trainer side is gone.
  std::size_t used = stats("trainer").mapped_bytes + stats("optimizer").mapped_bytes;
  ASSERT_GT(engine_bytes, 20u << 20);
  ASSERT_EQ(emulator().set_device_bytes(0, used + (20u << 20)), 0);
  const char* trainer_tags[] = {"trainer", "optimizer"};
  emulator().set_copy_bytes_per_second(400u << 20);
  for (int cycle = 0; cycle < 3; ++cycle) {
    TAGMEM_OK(tagmem_swap(trainer_tags, 2, engine_tag, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(stats("engine").state, TAGMEM_RESIDENT);
    EXPECT_EQ(stats("trainer").state, TAGMEM_OFFLOADED_BACKUP);
    EXPECT_EQ(corrupted(engine), 0u);
    TAGMEM_OK(tagmem_swap(engine_tag, 1, trainer_tags, 2, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(trainer) + corrupted(optimizer), 0u);
  }
}

// A swap whose in-side fits only as its out-side goes copies the out-side on one D2H stream, so
// that out-mappings finish in address order and the in-side can start after the first (copy
// engines need not serve two streams of one direction fairly: copy_queue::keep_d2h_order); a
// swap with room for both sides spreads its pieces over the streams.
TEST_F(EmulatorPipeline, TightSwapCopiesItsOutSideInOrder) {
  for (bool tight : {false, true}) {
    const std::string path = ::testing::TempDir() + "tagmem_tight_" +
                             std::to_string(rng_() % 1000000) + (tight ? "_t" : "_r") + ".json";
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
    {
      scoped_env trace("TAGMEM_TRACE", path.c_str());
      tagmem_config cfg;
      tagmem_config_init(&cfg);
      cfg.copy_piece_bytes = 1u << 20;
      ASSERT_EQ(tagmem_init(&cfg), TAGMEM_SUCCESS) << tagmem_last_error();
    }
    auto engine = fill("engine", 4, 8 << 20);
    const char* engine_tag[] = {"engine"};
    const char* trainer_tag[] = {"trainer"};
    TAGMEM_OK(tagmem_offload(engine_tag, 1, 0, TAGMEM_BACKUP));
    auto trainer = fill("trainer", 4, 8 << 20);
    if (tight) {
      ASSERT_EQ(emulator().set_device_bytes(0, device_bytes_ - device_free_bytes() + (8u << 20)),
                0);
    }
    TAGMEM_OK(tagmem_swap(trainer_tag, 1, engine_tag, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(engine), 0u);
    TAGMEM_OK(tagmem_trace_flush());
    const auto tracks = d2h_tracks(path, "trainer");
    if (tight) {
      EXPECT_EQ(tracks.size(), 1u) << "the tight swap's out-side copies were spread over streams";
    } else {
      EXPECT_GT(tracks.size(), 1u) << "the roomy swap's out-side copies used one stream";
    }
    ASSERT_EQ(emulator().set_device_bytes(0, device_bytes_), 0);
    TAGMEM_OK(tagmem_swap(engine_tag, 1, trainer_tag, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(trainer), 0u);
    for (const filled& a : engine) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
    for (const filled& a : trainer) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
    std::remove(path.c_str());
  }
}

TEST_F(EmulatorPipeline, SwapWhoseInTagCannotFitStillOffloads) {
  auto big = fill("big", 4, 16 << 20);
  const char* big_tag[] = {"big"};
  TAGMEM_OK(tagmem_offload(big_tag, 1, 0, TAGMEM_BACKUP));
  auto small = fill("small", 8, 1 << 20);
  std::size_t used = stats("small").mapped_bytes;
  ASSERT_EQ(emulator().set_device_bytes(0, used + (8u << 20)), 0);
  const char* small_tag[] = {"small"};
  TAGMEM_FAILS_WITH(tagmem_swap(small_tag, 1, big_tag, 1, 0, TAGMEM_BACKUP),
                    TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(stats("small").state, TAGMEM_OFFLOADED_BACKUP) << "the offload part must happen";
  EXPECT_EQ(stats("big").state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(stats("big").mapped_bytes, 0u);
  EXPECT_EQ(stats("big").host_bytes, 64u << 20) << "the backup must stay intact";
  ASSERT_EQ(emulator().set_device_bytes(0, device_bytes_), 0);
  TAGMEM_OK(tagmem_reload(big_tag, 1, 0));
  TAGMEM_OK(tagmem_reload(small_tag, 1, 0));
  EXPECT_EQ(corrupted(big) + corrupted(small), 0u);
}

TEST_F(EmulatorPipeline, ReloadFailureKeepsEarlierTagsAndLaterBackups) {
  auto first = fill("first", 3, 30 << 20);
  auto second = fill("second", 3, 30 << 20);
  const char* tags[] = {"first", "second"};
  TAGMEM_OK(tagmem_offload(tags, 2, 0, TAGMEM_BACKUP));
  emulator().fail_call("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY);  // second's only run
  TAGMEM_FAILS_WITH(tagmem_reload(tags, 2, 0), TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(stats("first").state, TAGMEM_RESIDENT);
  EXPECT_EQ(stats("second").state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(stats("second").mapped_bytes, 0u);
  EXPECT_EQ(corrupted(first), 0u);
  TAGMEM_OK(tagmem_reload(tags + 1, 1, 0));
  EXPECT_EQ(corrupted(second), 0u);
}

// Note [access in one call]: a DISCARD tag's reload grants access to its runs side by side in one
// cuMemSetAccess once all are mapped, and every byte is usable after (the emulator protects memory
// without access); TAGMEM_DISCARD_ACCESS=per_run grants it run by run.
TEST_F(EmulatorPipeline, DiscardReloadGrantsAccessInOneCall) {
  std::uint64_t calls[2] = {0, 0};
  const char* how[2] = {"together", "per_run"};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
    setenv("TAGMEM_DISCARD_ACCESS", how[i], 1);
    setenv("TAGMEM_DISCARD_MAPPING_BYTES", "2MiB", 1);  // runs stop at each mapping
    tagmem_config cfg;
    tagmem_config_init(&cfg);
    cfg.max_mapping_bytes = 2u << 20;
    const tagmem_status st = tagmem_init(&cfg);
    unsetenv("TAGMEM_DISCARD_ACCESS");
    unsetenv("TAGMEM_DISCARD_MAPPING_BYTES");
    ASSERT_EQ(st, TAGMEM_SUCCESS) << tagmem_last_error();
    auto kv = fill("kv", 6, 24 << 20);  // a segment, one mapping, each
    const char* tags[] = {"kv"};
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
    const std::uint64_t before = emulator().call_count("cuMemSetAccess");
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
    calls[i] = emulator().call_count("cuMemSetAccess") - before;
    refill(rng_, kv);  // faults in the emulator where access is missing
    EXPECT_EQ(corrupted(kv), 0u) << how[i];
  }
  EXPECT_EQ(calls[0], 1u) << "one call for the runs side by side";
  EXPECT_GE(calls[1], 6u) << "one call per run";
}

TEST_F(EmulatorPipeline, CopyAndMappingCallsDoNotGrowWithTheNumberOfAllocations) {
  auto many = fill("many", 2000, 64 << 10);  // 125 MiB in 63 chunks of 2 MiB
  tagmem_tag_stats s = stats("many");
  ASSERT_GT(s.mappings, 50u);
  const std::uint64_t copies = s.mapped_bytes / (1u << 20) + 8;  // 1 MiB pieces, a few cuts
  const char* tags[] = {"many"};
  for (int cycle = 0; cycle < 2; ++cycle) {
    std::uint64_t d2h = emulator().call_count("cuMemcpyDtoHAsync");
    std::uint64_t h2d = emulator().call_count("cuMemcpyHtoDAsync");
    std::uint64_t creates = emulator().call_count("cuMemCreate");
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
    EXPECT_LE(emulator().call_count("cuMemcpyDtoHAsync") - d2h, copies);
    EXPECT_LE(emulator().call_count("cuMemcpyHtoDAsync") - h2d, copies);
    EXPECT_LE(emulator().call_count("cuMemCreate") - creates, 1u) << "one coalesced run";
  }
  EXPECT_EQ(stats("many").mappings, 1u);
  EXPECT_EQ(corrupted(many), 0u);
}

TEST_F(EmulatorPipeline, HostStorePinsInTheBackgroundReusesAndTrims) {
  TAGMEM_OK(tagmem_host_reserve(96u << 20, 0));
  tagmem_device_stats ds{};
  // The call returned at once; wait (up to a minute on a loaded machine) for the threads.
  for (int i = 0; i < 6000; ++i) {
    TAGMEM_OK(tagmem_device_stats_get(0, &ds));
    if (ds.host_pinned_bytes >= (96u << 20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(ds.host_pinned_bytes, 96u << 20);
  const std::size_t pinned = ds.host_pinned_bytes;
  auto data = fill("w", 4, 20 << 20);
  const char* tags[] = {"w"};
  for (int cycle = 0; cycle < 3; ++cycle) {
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_device_stats_get(0, &ds));
    EXPECT_EQ(ds.host_pinned_bytes, pinned) << "the reserve covers the backup: no pinning";
    EXPECT_EQ(ds.host_pinned_high_water, pinned);
    TAGMEM_OK(tagmem_host_trim(0));  // keeps what holds the backup
    TAGMEM_OK(tagmem_device_stats_get(0, &ds));
    EXPECT_GE(ds.host_pinned_bytes, ds.host_used_bytes);
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
    EXPECT_EQ(corrupted(data), 0u);
    TAGMEM_OK(tagmem_host_reserve(pinned, 1));
  }
  TAGMEM_OK(tagmem_host_trim(0));
  TAGMEM_OK(tagmem_device_stats_get(0, &ds));
  EXPECT_EQ(ds.host_pinned_bytes, 0u);
  EXPECT_EQ(ds.host_pinned_high_water, pinned);
}

}  // namespace
}  // namespace tagmem::test
