// map_ahead_test.cpp — memory handed to a process whose DISCARD tag is offloaded is mapped into
// that tag as it arrives, and the tag's reload takes it back with no driver call (Note [mapped
// ahead] in allocator/offload/map_ahead.hpp). The givers are meet_test.cpp's `discard_giver` and
// wait_test.cpp's `resident_giver` (processes that offload a DISCARD tag of two 30 MiB mappings)
// and overlap_test.cpp's `overlap_trainer`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "emu_controls.hpp"
#include "harness.hpp"

namespace tagmem::handoff_test {
namespace {

const char* kKv = "kv";

tagmem_tag_stats kv_stats() {
  tagmem_tag_stats s{};
  check(tagmem_tag_stats_get(kKv, 0, &s), "tagmem_tag_stats_get");
  return s;
}

struct driver_calls {
  std::uint64_t creates = emu_calls("cuMemCreate"), maps = emu_calls("cuMemMap"),
                access = emu_calls("cuMemSetAccess");
  bool operator==(const driver_calls&) const = default;
};

class map_ahead_test : public shared_device_test {
 protected:
  std::size_t size_ = kPiece;  // of each kv allocation
  // This process with mapping ahead on, TAGMEM_HANDOFF_HOLD_MS `hold` ("" for the default).
  void init(const char* hold = "") {
    if (*hold) setenv("TAGMEM_HANDOFF_HOLD_MS", hold, 1);
    const tagmem_status s = init_with("TAGMEM_HANDOFF_MAP_AHEAD", "on");
    unsetenv("TAGMEM_HANDOFF_HOLD_MS");
    ASSERT_EQ(s, TAGMEM_SUCCESS) << tagmem_last_error();
  }
  // The kv cache: two allocations of size_, offloaded (DISCARD). Nobody takes it.
  tag_data offloaded_kv(std::mt19937_64& rng) {
    tag_data kv = fill_tag(kKv, 2, size_, rng);
    EXPECT_EQ(tagmem_offload(&kKv, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
    return kv;
  }
  bool all_mapped_ahead() {
    return handoff_stats().held_bytes == 0 && kv_stats().parked_bytes == 2 * size_;
  }
};

class HandoffMapAhead : public map_ahead_test, public ::testing::WithParamInterface<std::size_t> {
 protected:
  void SetUp() override {
    map_ahead_test::SetUp();
    size_ = GetParam();
  }
};

// kv mappings larger than the handles handed over: some of each is created.
class HandoffMapAheadRoom : public map_ahead_test {
 protected:
  void SetUp() override {
    map_ahead_test::SetUp();
    size_ = kPiece + 10 * MiB;
  }
};

// Each 30 MiB handle fills a kv mapping of 30 MiB, or most of one of 40 MiB, whose other 10 MiB
// is created beside it, ahead too.
INSTANTIATE_TEST_SUITE_P(Sizes, HandoffMapAhead, ::testing::Values(kPiece, kPiece + 10 * MiB));

TEST_P(HandoffMapAhead, TheKvReloadTakesItBackWithNoDriverCall) {
  init();
  std::mt19937_64 rng(seed_);
  tag_data kv = offloaded_kv(rng);
  discard_giver_hands_over(seed_ + 1);
  ASSERT_TRUE(eventually([&] { return all_mapped_ahead(); }))
      << "held " << handoff_stats().held_bytes << " parked " << kv_stats().parked_bytes;
  EXPECT_EQ(kv_stats().mapped_bytes, 0u);  // offloaded all along
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 2 * kPiece);
  const driver_calls before;
  ASSERT_EQ(tagmem_reload(&kKv, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(driver_calls(), before);
  EXPECT_EQ(kv_stats().parked_bytes, 0u);
  EXPECT_EQ(kv_stats().mapped_bytes, 2 * size_);
  refill(kv, rng());  // a DISCARD reload's bytes are anyone's: every byte is usable
  EXPECT_EQ(corrupted(kv), 0u);
  for (void* p : kv.ptrs) ASSERT_EQ(tagmem_free(p, nullptr), TAGMEM_SUCCESS);
}

// Another tag's reload in between (a recycling one: the engine's weights before its kv cache)
// leaves the memory mapped ahead to its tag.
TEST_P(HandoffMapAhead, AnotherTagsReloadLeavesIt) {
  init();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  tag_data kv = offloaded_kv(rng);
  discard_giver_hands_over(seed_ + 1);
  ASSERT_TRUE(eventually([&] { return all_mapped_ahead(); }));
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_EQ(kv_stats().parked_bytes, 2 * size_);
  const driver_calls before;
  ASSERT_EQ(tagmem_reload(&kKv, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(driver_calls(), before);
  refill(kv, rng());
  EXPECT_EQ(corrupted(kv), 0u);
  EXPECT_EQ(corrupted(w), 0u);
}

// Not reloaded within TAGMEM_HANDOFF_HOLD_MS, it goes back to the driver; the reload then makes
// the memory anew.
TEST_P(HandoffMapAhead, NotReloadedItGoesBackAfterTheHold) {
  init("300");
  std::mt19937_64 rng(seed_);
  tag_data kv = offloaded_kv(rng);
  discard_giver_hands_over(seed_ + 1);
  // Mapped ahead, then given back: the device empty (the giver has exited).
  ASSERT_TRUE(eventually([&] {
    return kv_stats().parked_bytes == 0 && handoff_stats().held_bytes == 0 &&
           reliability::emu().device_used_bytes(0) == 0;
  })) << "parked "
      << kv_stats().parked_bytes << " used " << reliability::emu().device_used_bytes(0);
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 2 * kPiece);  // it had been mapped ahead
  const driver_calls before;
  ASSERT_EQ(tagmem_reload(&kKv, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_GT(emu_calls("cuMemCreate"), before.creates);
  refill(kv, rng());
  EXPECT_EQ(corrupted(kv), 0u);
}

// With no room on the device for what the handles leave of a mapping, it is not mapped ahead:
// the handles wait for the reload, which maps them once there is room.
TEST_F(HandoffMapAheadRoom, NoRoomForTheRestLeavesTheHandlesHeld) {
  init();
  std::mt19937_64 rng(seed_);
  tag_data kv = offloaded_kv(rng);
  {
    peer_process giver("resident_giver", "g");  // wait_test.cpp's: says when its tag is made
    giver.channel().send(std::to_string(seed_ + 1));
    ASSERT_EQ(giver.channel().receive(), "resident");
    fill_device();  // the device is full with the giver's 60 MiB
    giver.channel().send("offload");
    EXPECT_EQ(giver.channel().receive(), "given " + std::to_string(2 * kPiece));
    giver.channel().send("exit");
    EXPECT_EQ(giver.wait(), 0);
  }
  ASSERT_TRUE(eventually([] { return handoff_stats().held_bytes == 2 * kPiece; }));
  EXPECT_EQ(kv_stats().parked_bytes, 0u);
  reliability::emu().set_device_bytes(0, total_);
  ASSERT_EQ(tagmem_reload(&kKv, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 2 * kPiece);
  refill(kv, rng());
  EXPECT_EQ(corrupted(kv), 0u);
}

// Fewer handed bytes than the kv cache maps: they are spread over its mappings, so that every
// mapping gets some (and the rest is made beside them) rather than the first ones all of it and
// the others none. The giver is overlap_test.cpp's trainer: four 16 MiB mappings, resident, then
// paused (BACKUP); the kv cache has two mappings of 64 MiB.
TEST_F(HandoffMapAheadRoom, FewerHandedBytesReachEveryMapping) {
  size_ = 64 * MiB;
  init();
  std::mt19937_64 rng(seed_);
  tag_data kv = offloaded_kv(rng);
  peer_process trainer("overlap_trainer", "t");
  trainer.channel().send(std::to_string(seed_ + 1) + " 4 16 0");
  ASSERT_EQ(trainer.channel().receive(), "ready");
  trainer.channel().send("pause");
  EXPECT_EQ(trainer.channel().receive(), "paused given " + std::to_string(64 * MiB));
  ASSERT_TRUE(eventually([&] { return all_mapped_ahead(); }))
      << "held " << handoff_stats().held_bytes << " parked " << kv_stats().parked_bytes;
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 64 * MiB);
  const driver_calls before;
  ASSERT_EQ(tagmem_reload(&kKv, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(driver_calls(), before);
  refill(kv, rng());
  EXPECT_EQ(corrupted(kv), 0u);
  trainer.channel().send("resume");
  EXPECT_EQ(trainer.channel().receive(), "intact");
  trainer.channel().send("exit");
  EXPECT_EQ(trainer.wait(), 0);
}

}  // namespace
}  // namespace tagmem::handoff_test
