// copy_mark_test.cpp — when a reload holds its copy mark (Note [copying in hand] in
// allocator/offload/offload_engine.cpp): from its start, before its first run maps, whether or not
// the memory it maps is free or handed over yet; not while it waits for the job's memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "emu_controls.hpp"
#include "harness.hpp"

namespace tagmem::handoff_test {
namespace {

class CopyMark : public shared_device_test {
 protected:
  void TearDown() override {
    reliability::emu().release_held_map();
    reliability::emu().set_device_bytes(0, total_);
    shared_device_test::TearDown();
  }
  static std::string dir() {
    const char* d = std::getenv("TAGMEM_PEER_DIR");
    return d ? d : "";
  }
};

// The device has room for the whole reload: it marks at once, and the emulator holds its first
// map meanwhile.
TEST_F(CopyMark, AReloadWithItsMemoryInHandMarksBeforeItMaps) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  ASSERT_FALSE(dir().empty());
  reliability::emu().hold_next_map();
  {
    reload_thread reloader("w");
    EXPECT_TRUE(eventually([] { return copy_mark_held(dir()); }))
        << "the reload did not mark before mapping, with its memory free";
    reliability::emu().release_held_map();
    ASSERT_EQ(reloader.finish(), "");
  }
  EXPECT_FALSE(copy_mark_held(dir())) << "the mark outlived the reload";
  EXPECT_EQ(corrupted(w), 0u);
}

// The device is full: the reload waits for the job's memory (TAGMEM_HANDOFF_WAIT_MS) and holds no
// mark meanwhile, so that nobody holds back what it waits for; with the memory back it reloads.
TEST_F(CopyMark, AReloadThatWaitsForMemoryHoldsNoMark) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  fill_device();
  const std::uint64_t creates = emu_calls("cuMemCreate");
  {
    reload_thread reloader("w");
    // It tried to create its first run and waits now, its mark (taken at its start) let go.
    ASSERT_TRUE(eventually([&] { return emu_calls("cuMemCreate") > creates; }));
    ASSERT_TRUE(eventually([] { return !copy_mark_held(dir()); }))
        << "a reload waiting for memory held its mark";
    for (int i = 0; i < 40; ++i) {
      ASSERT_FALSE(copy_mark_held(dir())) << "a reload waiting for memory held its mark";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reliability::emu().set_device_bytes(0, total_);
    ASSERT_EQ(reloader.finish(), "");
  }
  EXPECT_EQ(corrupted(w), 0u);
}

// The device has room for the reload's first run only and the job has handed nothing: the reload
// marks before it maps all the same, since a giver's leftovers released beside its copies would
// slow them whether or not it needs that memory; once its second run does not fit, it waits and
// lets the mark go.
TEST_F(CopyMark, AReloadThatHasNotRunShortMarksBeforeItsMemoryIsInHand) {
  ASSERT_EQ(init_with("TAGMEM_MAX_MAPPING_BYTES", "30MiB"), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 3, kPiece, rng);  // three runs of one mapping each
  reliability::emu().set_device_bytes(0, reliability::emu().device_used_bytes(0) + kPiece * 3 / 2);
  reliability::emu().hold_next_map();
  {
    reload_thread reloader("w");
    EXPECT_TRUE(eventually([] { return copy_mark_held(dir()); }))
        << "the reload did not mark before mapping, with room for one run of three";
    reliability::emu().release_held_map();
    EXPECT_TRUE(eventually([] { return !copy_mark_held(dir()); }))
        << "the reload held its mark while it waited for memory";
    reliability::emu().set_device_bytes(0, total_);
    ASSERT_EQ(reloader.finish(), "");
  }
  EXPECT_FALSE(copy_mark_held(dir())) << "the mark outlived the reload";
  EXPECT_EQ(corrupted(w), 0u);
}

}  // namespace
}  // namespace tagmem::handoff_test
