// recycle_test.cpp — physical memory recycled inside the process (Note [physical recycling] in
// physical_recycler.hpp): a swap maps for its in-side the handles its out-side unmaps, with
// TAGMEM_RECYCLE_PHYSICAL=keep an offload keeps them for a later reload until
// tagmem_release_physical / tagmem_wait_released, and every byte survives, with or without a
// driver call failing on the way. The Recycle suite runs on both drivers; EmulatorRecycle counts
// driver calls, injects faults and shrinks the emulated device.
#include <string>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = 1u << 20;
const char* eng[] = {"engine"};
const char* trn[] = {"trainer"};

std::size_t pending_bytes() {
  tagmem_device_stats ds{};
  EXPECT_EQ(tagmem_device_stats_get(0, &ds), TAGMEM_SUCCESS) << tagmem_last_error();
  return ds.release_pending_bytes;
}

tagmem_device_stats device_stats() {
  tagmem_device_stats ds{};
  EXPECT_EQ(tagmem_device_stats_get(0, &ds), TAGMEM_SUCCESS) << tagmem_last_error();
  return ds;
}

// Shuts tagmem down and starts it again with TAGMEM_RECYCLE_PHYSICAL=`mode`.
void restart_recycling(const char* mode) { restart_with_env("TAGMEM_RECYCLE_PHYSICAL", mode); }

// The engine (one more allocation than the trainer, so that a swap to it also creates memory)
// offloaded with BACKUP, then the trainer resident; both hold random bytes.
struct sides {
  std::vector<filled> engine, trainer;
};
sides two_sides(std::mt19937_64& rng, std::size_t unit = 48 * MiB) {
  sides s;
  s.engine = fill(rng, "engine", 4, unit);
  auto extra = fill(rng, "engine", 1, 16 * MiB);
  s.engine.insert(s.engine.end(), extra.begin(), extra.end());
  EXPECT_EQ(tagmem_offload(eng, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  s.trainer = fill(rng, "trainer", 4, unit);
  return s;
}

using Recycle = tagmem_test;

TEST_F(Recycle, SwapsBothWaysKeepEveryByte) {
  auto rng = rng_for_test();
  sides s = two_sides(rng);
  for (int round = 0; round < 3; ++round) {
    TAGMEM_OK(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(s.engine), 0u) << "round " << round;
    refill(rng, s.engine);
    TAGMEM_OK(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(s.trainer), 0u) << "round " << round;
    refill(rng, s.trainer);
  }
  TAGMEM_OK(tagmem_reload(eng, 1, 0));
  EXPECT_EQ(corrupted(s.engine), 0u);
  free_all(s.engine);
  free_all(s.trainer);
}

TEST_F(Recycle, KeptMemoryCarriesBytesAcrossOffloadAndReload) {
  restart_recycling("keep");
  auto rng = rng_for_test();
  sides s = two_sides(rng);
  for (int round = 0; round < 3; ++round) {
    TAGMEM_OK(tagmem_offload(trn, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(eng, 1, 0));
    EXPECT_EQ(corrupted(s.engine), 0u) << "round " << round;
    refill(rng, s.engine);
    TAGMEM_OK(tagmem_offload(eng, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(trn, 1, 0));
    EXPECT_EQ(corrupted(s.trainer), 0u) << "round " << round;
    refill(rng, s.trainer);
  }
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_EQ(pending_bytes(), 0u);
  TAGMEM_OK(tagmem_reload(eng, 1, 0));
  EXPECT_EQ(corrupted(s.engine), 0u);
  free_all(s.engine);
  free_all(s.trainer);
}

TEST_F(Recycle, ReleasePhysicalChecksTheDevice) {
  TAGMEM_FAILS_WITH(tagmem_release_physical(1 << 20), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_OK(tagmem_release_physical(0));  // nothing kept: returns at once
}

using EmulatorRecycle = tagmem_test;

std::uint64_t calls(const char* entry) { return emulator().call_count(entry); }

// A memory-tight swap (free memory holds a quarter of one side): each in-run maps the handles
// the out-side unmapped, no cuMemCreate, no cuMemRelease.
TEST_F(EmulatorRecycle, TightSwapMapsWhatItsOutSideUnmaps) {
  auto rng = rng_for_test();
  auto engine = fill(rng, "engine", 4, 48 * MiB);
  TAGMEM_OK(tagmem_offload(eng, 1, 0, TAGMEM_BACKUP));
  auto trainer = fill(rng, "trainer", 4, 48 * MiB);
  const std::size_t limit = emulator().device_bytes(0);
  ASSERT_EQ(emulator().set_device_bytes(0, limit - device_free_bytes() + 48 * MiB), 0);
  for (int round = 0; round < 2; ++round) {
    const std::uint64_t created = calls("cuMemCreate"), released = calls("cuMemRelease");
    TAGMEM_OK(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_wait_released(0));
    EXPECT_EQ(calls("cuMemCreate") - created, 0u) << "round " << round;
    EXPECT_EQ(calls("cuMemRelease") - released, 0u) << "round " << round;
    EXPECT_EQ(corrupted(engine), 0u);
    refill(rng, engine);
    TAGMEM_OK(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(trainer), 0u);
    refill(rng, trainer);
  }
  free_all(trainer);
  TAGMEM_OK(tagmem_empty_cache(0));
  TAGMEM_OK(tagmem_reload(eng, 1, 0));
  EXPECT_EQ(corrupted(engine), 0u);
  free_all(engine);
  ASSERT_EQ(emulator().set_device_bytes(0, limit), 0);
}

TEST_F(EmulatorRecycle, OffRecyclesNothing) {
  restart_recycling("off");
  auto rng = rng_for_test();
  sides s = two_sides(rng);
  const std::uint64_t created = calls("cuMemCreate");
  TAGMEM_OK(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
  EXPECT_GT(calls("cuMemCreate") - created, 0u);
  EXPECT_EQ(corrupted(s.engine), 0u);
  free_all(s.engine);
  TAGMEM_OK(tagmem_reload(trn, 1, 0));
  free_all(s.trainer);
}

// TAGMEM_RECYCLE_PHYSICAL=keep: a DISCARD offload and a BACKUP offload keep their memory (the
// driver gets nothing back: free memory does not move), reloads map it without a create, and
// tagmem_release_physical + tagmem_wait_released give it all back.
TEST_F(EmulatorRecycle, KeptMemoryServesReloadsUntilReleased) {
  restart_recycling("keep");
  auto rng = rng_for_test();
  auto kv = fill(rng, "kv", 4, 64 * MiB);
  auto weights = fill(rng, "weights", 4, 32 * MiB);
  const char* kv_tag[] = {"kv"};
  const char* w_tag[] = {"weights"};
  const std::size_t free_before = device_free_bytes();
  const std::uint64_t created = calls("cuMemCreate"), released = calls("cuMemRelease");
  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
  TAGMEM_OK(tagmem_offload(w_tag, 1, 0, TAGMEM_BACKUP));
  EXPECT_EQ(pending_bytes(), 384 * MiB);
  EXPECT_EQ(device_free_bytes(), free_before);
  EXPECT_EQ(device_stats().host_used_bytes, 128 * MiB);
  TAGMEM_OK(tagmem_reload(w_tag, 1, 0));
  TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
  EXPECT_EQ(calls("cuMemCreate") - created, 0u);
  EXPECT_EQ(calls("cuMemRelease") - released, 0u);
  EXPECT_EQ(corrupted(weights), 0u);
  EXPECT_EQ(pending_bytes(), 0u);
  EXPECT_EQ(device_stats().host_used_bytes, 0u);

  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
  TAGMEM_OK(tagmem_offload(w_tag, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_release_physical(0));  // nothing kept any more: the reload creates
  const std::uint64_t created_again = calls("cuMemCreate");
  TAGMEM_OK(tagmem_reload(w_tag, 1, 0));
  EXPECT_GT(calls("cuMemCreate") - created_again, 0u);
  EXPECT_EQ(corrupted(weights), 0u);
  TAGMEM_OK(tagmem_offload(w_tag, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_EQ(pending_bytes(), 0u);
  EXPECT_EQ(device_free_bytes(), free_before + 384 * MiB);
  EXPECT_EQ(state_of("kv"), TAGMEM_OFFLOADED_DISCARD);
  TAGMEM_OK(tagmem_reload(w_tag, 1, 0));
  EXPECT_EQ(corrupted(weights), 0u);
  TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
  free_all(kv);
  free_all(weights);
}

// With `keep`, a DISCARD offload parks its mappings and the tag's reload takes them back: no
// driver call either way (Note [parked mappings]); the memory counts as kept meanwhile, and
// shutting down with it parked leaks nothing.
TEST_F(EmulatorRecycle, ParkedDiscardOffloadAndReloadMakeNoDriverCall) {
  restart_recycling("keep");
  auto rng = rng_for_test();
  auto kv = fill(rng, "kv", 4, 64 * MiB);
  const char* kv_tag[] = {"kv"};
  const char* entries[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                           "cuMemRelease"};
  auto driver_calls = [&] {
    std::uint64_t n = 0;
    for (const char* e : entries) n += calls(e);
    return n;
  };
  const std::size_t mappings = emulator().live_mappings();
  for (int round = 0; round < 3; ++round) {
    const std::uint64_t before = driver_calls();
    TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
    EXPECT_EQ(driver_calls() - before, 0u) << "round " << round;
    EXPECT_EQ(state_of("kv"), TAGMEM_OFFLOADED_DISCARD);
    tagmem_tag_stats ts{};
    TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &ts));
    EXPECT_EQ(ts.mapped_bytes, 0u);
    EXPECT_EQ(ts.parked_bytes, 256 * MiB) << "its addresses are still mapped";
    EXPECT_EQ(pending_bytes(), 256 * MiB);  // kept, not yet back with the driver
    TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
    TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &ts));
    EXPECT_EQ(ts.parked_bytes, 0u);
    EXPECT_EQ(ts.mapped_bytes, 256 * MiB);
    EXPECT_EQ(driver_calls() - before, 0u) << "round " << round;
    EXPECT_EQ(pending_bytes(), 0u);
    EXPECT_EQ(emulator().live_mappings(), mappings);
    for (const filled& a : kv) {  // usable at the same addresses
      auto bytes = random_bytes(rng, a.bytes.size());
      write_device(a.ptr, bytes.data(), bytes.size());
      EXPECT_EQ(read_device(a.ptr, bytes.size()), bytes) << "round " << round;
    }
  }
  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(emulator().live_mappings(), 0u);
  EXPECT_EQ(emulator().live_allocations(), 0u);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
}

const char* w_tag[] = {"weights"};
const char* kv_tag[] = {"kv"};

// The weights offloaded (BACKUP) with their own memory back with the driver, then the kv cache
// parked by a DISCARD offload: kept memory for the weights' reload is the kv cache's alone.
void park_kv_beside_offloaded_weights(std::mt19937_64& rng, int count, std::size_t size,
                                      std::vector<filled>& weights, std::vector<filled>& kv) {
  weights = fill(rng, "weights", count, size);
  TAGMEM_OK(tagmem_offload(w_tag, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_release_physical(0));
  kv = fill(rng, "kv", count, size);
  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
}

// Parked memory is anyone's: another tag's reload unmaps it from the offloaded tag and maps it
// (no create), the offloaded tag's old addresses fault instead of aliasing the new owner's bytes,
// and its own reload then maps new memory. tagmem_wait_released gives parked memory back too.
TEST_F(EmulatorRecycle, ParkedMemoryServesAnotherTagAndStopsAliasing) {
  restart_recycling("keep");
  auto rng = rng_for_test();
  std::vector<filled> weights, kv;
  park_kv_beside_offloaded_weights(rng, 4, 32 * MiB, weights, kv);
  tagmem_tag_stats ts{};
  TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &ts));
  EXPECT_EQ(ts.parked_bytes, 128 * MiB);
  const std::uint64_t created = calls("cuMemCreate"), unmapped = calls("cuMemUnmap");
  TAGMEM_OK(tagmem_reload(w_tag, 1, 0));
  TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &ts));
  EXPECT_EQ(ts.parked_bytes, 0u) << "its memory went to the weights";
  EXPECT_EQ(calls("cuMemCreate") - created, 0u);  // the kv cache's parked memory
  EXPECT_EQ(calls("cuMemUnmap") - unmapped, 4u);  // unparked: one unmap per kv mapping
  EXPECT_EQ(corrupted(weights), 0u);
  std::vector<unsigned char> probe(4096);
  EXPECT_NE(driver_api_for_tests().cuMemcpyDtoH(
                probe.data(), reinterpret_cast<CUdeviceptr>(kv[0].ptr), probe.size()),
            CUDA_SUCCESS)
      << "the offloaded kv cache still maps memory that the weights now hold";
  TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
  EXPECT_GT(calls("cuMemCreate") - created, 0u);
  refill(rng, kv);
  EXPECT_EQ(corrupted(weights), 0u);
  EXPECT_EQ(corrupted(kv), 0u);

  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
  const std::size_t free_before = device_free_bytes();
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_EQ(device_free_bytes(), free_before + 128 * MiB);
  EXPECT_EQ(pending_bytes(), 0u);
  TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
  refill(rng, kv);
  EXPECT_EQ(corrupted(kv), 0u);
  free_all(kv);
  free_all(weights);
}

// An unpark whose cuMemUnmap fails leaves that mapping parked: the reload that wanted it creates
// memory instead, and the parked tag still takes its own back with no driver call.
TEST_F(EmulatorRecycle, AFailedUnparkLeavesTheMappingParked) {
  restart_recycling("keep");
  auto rng = rng_for_test();
  std::vector<filled> weights, kv;
  park_kv_beside_offloaded_weights(rng, 1, 64 * MiB, weights, kv);
  ASSERT_EQ(emulator().fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN), 0);
  const std::uint64_t created = calls("cuMemCreate");
  TAGMEM_OK(tagmem_reload(w_tag, 1, 0));
  emulator().clear_faults();
  EXPECT_EQ(calls("cuMemCreate") - created, 1u);
  EXPECT_EQ(corrupted(weights), 0u);
  EXPECT_EQ(pending_bytes(), 64 * MiB);  // still parked
  const std::uint64_t mapped = calls("cuMemMap");
  TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
  EXPECT_EQ(calls("cuMemMap") - mapped, 0u);
  refill(rng, kv);
  EXPECT_EQ(corrupted(kv), 0u);
  EXPECT_EQ(corrupted(weights), 0u);
  free_all(kv);
  free_all(weights);
}

// Kept memory is no one else's loss: an allocation that needs it gets it.
TEST_F(EmulatorRecycle, AllocationThatNeedsKeptMemoryGetsIt) {
  restart_recycling("keep");
  const std::size_t limit = emulator().device_bytes(0);
  const std::size_t used = limit - device_free_bytes();
  ASSERT_EQ(emulator().set_device_bytes(0, used + 400 * MiB), 0);
  auto rng = rng_for_test();
  auto kv = fill(rng, "kv", 1, 300 * MiB);
  const char* kv_tag[] = {"kv"};
  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
  EXPECT_EQ(pending_bytes(), 300 * MiB);
  auto other = fill(rng, "other", 1, 300 * MiB);  // only fits once the kept memory is released
  EXPECT_EQ(corrupted(other), 0u);
  free_all(other);
  TAGMEM_OK(tagmem_empty_cache(0));
  TAGMEM_OK(tagmem_reload(kv_tag, 1, 0));
  free_all(kv);
  ASSERT_EQ(emulator().set_device_bytes(0, limit), 0);
}

// Each driver call a recycling swap and a recycling reload make, failing in turn: the call
// reports the error, a retry succeeds, no byte is lost, and nothing leaks.
// The device is tight (free memory holds a third of the trainer), so the swap's in-side maps
// what its out-side unmaps.
void fail_each_call(const char* mode, const char* entry) {
  auto rng = rng_for_test();
  const std::size_t limit = emulator().device_bytes(0);
  for (std::uint64_t nth = 1;; ++nth) {
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
    ASSERT_EQ(emulator().live_allocations(), 0u) << entry << " #" << nth;
    ASSERT_EQ(emulator().set_device_bytes(0, limit), 0);
    {
      scoped_env env("TAGMEM_RECYCLE_PHYSICAL", mode);
      ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    }
    sides s = two_sides(rng, 12 * MiB);
    const char* kv_tag[] = {"kv"};
    auto kv = fill(rng, "kv", 2, 12 * MiB);
    TAGMEM_OK(tagmem_wait_released(0));  // with `keep`, the engine's offload kept its memory
    ASSERT_EQ(emulator().set_device_bytes(0, limit - device_free_bytes() + 24 * MiB), 0);
    ASSERT_EQ(emulator().fail_call(entry, nth, CUDA_ERROR_OUT_OF_MEMORY), 0);
    const std::uint64_t before = calls(entry);
    bool failed = false;
    auto call = [&](tagmem_status st) {
      if (st == TAGMEM_SUCCESS) return;
      failed = true;
      EXPECT_STRNE(tagmem_last_error(), "");
    };
    call(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP));
    call(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
    if (state_of("kv") != TAGMEM_RESIDENT) call(tagmem_reload(kv_tag, 1, 0));
    const bool fired = calls(entry) - before >= nth;
    emulator().clear_faults();
    // The retry finishes what failed: the trainer out (a partial offload is finished by another),
    // the engine and the kv cache in.
    auto retry = [&](const char* tag, bool out) {
      const char* one[] = {tag};
      tagmem_tag_stats ts{};
      ASSERT_EQ(tagmem_tag_stats_get(tag, 0, &ts), TAGMEM_SUCCESS);
      const bool resident = ts.state == TAGMEM_RESIDENT;
      if (out && (resident || ts.mapped_bytes != 0)) {
        ASSERT_EQ(tagmem_offload(one, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS)
            << entry << " #" << nth << ", " << tag << ": " << tagmem_last_error();
      } else if (!out && !resident) {
        ASSERT_EQ(tagmem_reload(one, 1, 0), TAGMEM_SUCCESS)
            << entry << " #" << nth << ", " << tag << ": " << tagmem_last_error();
      }
    };
    retry("trainer", true);
    retry("engine", false);
    retry("kv", false);
    EXPECT_EQ(corrupted(s.engine), 0u) << entry << " #" << nth;
    TAGMEM_OK(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP));
    EXPECT_EQ(corrupted(s.trainer), 0u) << entry << " #" << nth;
    for (const filled& a : kv) {  // DISCARDed: usable, contents undefined
      auto bytes = random_bytes(rng, a.bytes.size());
      write_device(a.ptr, bytes.data(), bytes.size());
      EXPECT_EQ(read_device(a.ptr, bytes.size()), bytes) << entry << " #" << nth;
    }
    if (!fired) {
      EXPECT_FALSE(failed) << entry << " #" << nth << " did not fire, yet a call failed";
      EXPECT_GT(nth, 1u) << entry << " is never called";
      ASSERT_EQ(emulator().set_device_bytes(0, limit), 0);
      return;
    }
  }
}

class EmulatorRecycleFaults
    : public tagmem_test,
      public ::testing::WithParamInterface<std::tuple<const char*, const char*>> {};

TEST_P(EmulatorRecycleFaults, EachCallFailsCleanly) {
  fail_each_call(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(EmulatorSwap, EmulatorRecycleFaults,
                         ::testing::Combine(::testing::Values("swap"),
                                            ::testing::Values("cuMemCreate", "cuMemMap",
                                                              "cuMemSetAccess", "cuMemUnmap")));
INSTANTIATE_TEST_SUITE_P(EmulatorKeep, EmulatorRecycleFaults,
                         ::testing::Combine(::testing::Values("keep"),
                                            ::testing::Values("cuMemCreate", "cuMemMap",
                                                              "cuMemSetAccess", "cuMemUnmap")));

}  // namespace
}  // namespace tagmem::test
