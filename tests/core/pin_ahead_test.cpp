// pin_ahead_test.cpp — host memory pinned in the background while a tag planned for BACKUP
// grows (Note [pin ahead] in background_pinning.hpp): the first offload pins nothing new, the
// host budget bounds it, a DISCARD plan and TAGMEM_PIN_AHEAD=off pin nothing, and shutdown
// with the pinner at work is clean. wait_for_background_pinning() is the test hook that waits
// for the pinner instead of sleeping. Runs on both drivers, except the Emulator* suite (which
// counts pinned bytes in the emulator).
#include "host/background_pinning.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = 1u << 20;
const char* w[] = {"weights"};

tagmem_device_stats stats() {
  tagmem_device_stats ds{};
  EXPECT_EQ(tagmem_device_stats_get(0, &ds), TAGMEM_SUCCESS) << tagmem_last_error();
  return ds;
}

// "weights" planned for BACKUP, 128 MiB of random bytes, once the pinner is done with it.
std::vector<filled> planned_weights(std::mt19937_64& rng) {
  EXPECT_EQ(tagmem_tag_plan_offload("weights", 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  auto weights = fill(rng, "weights", 4, 32 * MiB);
  wait_for_background_pinning();
  return weights;
}

using PinAhead = tagmem_test;

TEST_F(PinAhead, FirstOffloadPinsNothingNew) {
  auto rng = rng_for_test();
  TAGMEM_OK(tagmem_tag_plan_offload("weights", 0, TAGMEM_BACKUP));
  auto weights = fill(rng, "weights", 6, 32 * MiB);
  wait_for_background_pinning();
  const tagmem_device_stats before = stats();
  EXPECT_GE(before.host_pinned_bytes, 192 * MiB);
  TAGMEM_OK(tagmem_offload(w, 1, 0, TAGMEM_BACKUP));
  const tagmem_device_stats after = stats();
  EXPECT_EQ(after.host_pinned_bytes, before.host_pinned_bytes);
  EXPECT_EQ(after.host_pinned_high_water, before.host_pinned_high_water);
  EXPECT_EQ(after.host_used_bytes, 192 * MiB);
  TAGMEM_OK(tagmem_reload(w, 1, 0));
  EXPECT_EQ(corrupted(weights), 0u);
  EXPECT_EQ(stats().host_used_bytes, 0u);
  free_all(weights);
}

// Growth after the first offload is pinned ahead too: the store covers backups held plus what
// the planned tags hold on the device.
TEST_F(PinAhead, GrowthNextToABackupIsPinnedToo) {
  auto rng = rng_for_test();
  TAGMEM_OK(tagmem_tag_plan_offload("weights", 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_tag_plan_offload("optim", 0, TAGMEM_BACKUP));
  auto weights = fill(rng, "weights", 4, 48 * MiB);
  TAGMEM_OK(tagmem_offload(w, 1, 0, TAGMEM_BACKUP));
  auto optim = fill(rng, "optim", 8, 40 * MiB);
  wait_for_background_pinning();
  const std::size_t pinned = stats().host_pinned_bytes;
  EXPECT_GE(pinned, (192 + 320) * MiB);
  const char* o[] = {"optim"};
  TAGMEM_OK(tagmem_offload(o, 1, 0, TAGMEM_BACKUP));
  EXPECT_EQ(stats().host_pinned_bytes, pinned);
  TAGMEM_OK(tagmem_reload(o, 1, 0));
  TAGMEM_OK(tagmem_reload(w, 1, 0));
  EXPECT_EQ(corrupted(weights), 0u);
  EXPECT_EQ(corrupted(optim), 0u);
  free_all(weights);
  free_all(optim);
}

// A plan repeated with the same mode changes nothing (the torch_memory_saver drop-in repeats its
// plan at every region): what a trim gave back stays unpinned until the tag grows again.
TEST_F(PinAhead, ARepeatedPlanDoesNotPinAgainWhatATrimGaveBack) {
  auto rng = rng_for_test();
  auto weights = planned_weights(rng);
  ASSERT_GE(stats().host_pinned_bytes, 128 * MiB);
  TAGMEM_OK(tagmem_host_trim(0));
  ASSERT_EQ(stats().host_pinned_bytes, 0u);
  TAGMEM_OK(tagmem_tag_plan_offload("weights", 0, TAGMEM_BACKUP));
  wait_for_background_pinning();
  EXPECT_EQ(stats().host_pinned_bytes, 0u) << "the repeated plan pinned the trimmed memory again";
  auto more = fill(rng, "weights", 1, 32 * MiB);  // growth pins ahead again
  wait_for_background_pinning();
  EXPECT_GE(stats().host_pinned_bytes, 160 * MiB);
  TAGMEM_OK(tagmem_offload(w, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(w, 1, 0));
  EXPECT_EQ(corrupted(weights), 0u);
  EXPECT_EQ(corrupted(more), 0u);
  free_all(weights);
  free_all(more);
}

TEST_F(PinAhead, DiscardPlanPinsNothing) {
  auto rng = rng_for_test();
  TAGMEM_OK(tagmem_tag_plan_offload("kv", 0, TAGMEM_DISCARD));
  auto kv = fill(rng, "kv", 4, 32 * MiB);
  wait_for_background_pinning();
  EXPECT_EQ(stats().host_pinned_bytes, 0u);
  free_all(kv);
}

TEST_F(PinAhead, OffPinsNothingAhead) {
  restart_with_env("TAGMEM_PIN_AHEAD", "off");
  auto rng = rng_for_test();
  auto weights = planned_weights(rng);
  EXPECT_EQ(stats().host_pinned_bytes, 0u);
  TAGMEM_OK(tagmem_offload(w, 1, 0, TAGMEM_BACKUP));  // pins for itself
  EXPECT_GE(stats().host_pinned_bytes, 128 * MiB);
  TAGMEM_OK(tagmem_reload(w, 1, 0));
  EXPECT_EQ(corrupted(weights), 0u);
  free_all(weights);
}

TEST_F(PinAhead, BadPlansAreRefused) {
  TAGMEM_FAILS_WITH(tagmem_tag_plan_offload("a b", 0, TAGMEM_BACKUP),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_tag_plan_offload("weights", 1 << 20, TAGMEM_BACKUP),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_tag_plan_offload("weights", 0, static_cast<tagmem_offload_mode>(7)),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
}

// The pinner stops at the host budget (TAGMEM_HOST_MAX_BYTES here); the offload that does not fit
// fails as before, leaving the tag resident with its bytes.
TEST_F(PinAhead, StaysWithinTheHostBudget) {
  restart_with_env("TAGMEM_HOST_MAX_BYTES", "64M");
  auto rng = rng_for_test();
  auto weights = planned_weights(rng);
  const tagmem_device_stats s = stats();
  EXPECT_LE(s.host_pinned_bytes, s.host_budget_bytes);
  EXPECT_LE(s.host_pinned_bytes, 64 * MiB);
  EXPECT_GT(s.host_pinned_bytes, 0u);
  TAGMEM_FAILS_WITH(tagmem_offload(w, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_EQ(corrupted(weights), 0u);
  free_all(weights);
}

using EmulatorPinAhead = tagmem_test;

// Shutdown while the pinner is at work stops it and unpins everything.
TEST_F(EmulatorPinAhead, ShutdownWhilePinning) {
  auto rng = rng_for_test();
  for (int round = 0; round < 3; ++round) {
    TAGMEM_OK(tagmem_tag_plan_offload("weights", 0, TAGMEM_BACKUP));
    fill(rng, "weights", 8, 64 * MiB);
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(emulator().pinned_host_bytes(), 0u) << "round " << round;
    EXPECT_EQ(emulator().live_host_registrations(), 0u) << "round " << round;
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  }
}

}  // namespace
}  // namespace tagmem::test
