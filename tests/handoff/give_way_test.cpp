// give_way_test.cpp — an offload that returned early holds its device-to-host copies back while
// another process of the job copies a reload with every run mapped (Note [copies give way] in
// allocator/offload/give_way.hpp): nothing of it is unmapped until that reload's copies end, then
// every byte comes back; with TAGMEM_HANDOFF_GIVE_WAY=off it copies beside the reload; a copier
// killed, or one that copies past TAGMEM_HANDOFF_TIMEOUT_MS, lets it go. (That this process's own
// marks never count: HandoffCopyGate in release_wait_test.cpp.)
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "emu_controls.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

// A process of the job that reloads its 60 MiB BACKUP tag with one copy held by the emulator, so
// that it holds its copy mark until told to let the copy go; then checks every byte.
TAGMEM_PEER_SCENARIO(held_copier) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  args.channel.send("offloaded");
  args.channel.expect("reload");
  reliability::emu().hold_next_h2d_copy();
  reload_thread reloader("w");
  const char* dir = std::getenv("TAGMEM_PEER_DIR");
  const bool marked = dir && eventually([&] { return copy_mark_held(dir); });
  args.channel.send(marked ? "copying" : "no mark");
  args.channel.expect("let go");
  reliability::emu().release_held_copy();
  const std::string outcome = reloader.finish();
  args.channel.send(!outcome.empty() ? outcome : corrupted(w) == 0 ? "intact" : "corrupted");
  args.channel.expect("exit");
  check(tagmem_shutdown(), "tagmem_shutdown");
  return emu_leaks().empty() ? 0 : 12;
}

class GiveWay : public early_return_test {
 protected:
  void TearDown() override {
    unsetenv("TAGMEM_HANDOFF_GIVE_WAY");
    unsetenv("TAGMEM_HANDOFF_TIMEOUT_MS");
    reliability::emu().release_held_copy();
    copier_.reset();  // its channel is a descriptor the leak check counts
    early_return_test::TearDown();
  }
  // Starts the copier (offloads done as usual there) and has it copying, its mark held.
  void start_copier() {
    copier_ = std::make_unique<peer_process>(
        "held_copier", "c", std::vector<std::string>{"TAGMEM_OFFLOAD_RETURN=done"});
    copier_->channel().send(std::to_string(seed_ + 1));
    ASSERT_EQ(copier_->channel().receive(), "offloaded");
    copier_->channel().send("reload");
    ASSERT_EQ(copier_->channel().receive(), "copying");
  }
  // This process's tag "g", 4 × 30 MiB, offloaded (returning early) while the copier copies.
  void offload_g() {
    std::mt19937_64 rng(seed_);
    g_ = fill_tag("g", 4, kPiece, rng);
    mappings_ = reliability::emu().live_mappings();
    const char* g_tag = "g";
    ASSERT_EQ(tagmem_offload(&g_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  }
  bool g_unmapped() const { return reliability::emu().live_mappings() < mappings_; }
  void reload_g_intact() {
    ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_TRUE(g_unmapped());
    const char* g_tag = "g";
    ASSERT_EQ(tagmem_reload(&g_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(corrupted(g_), 0u);
  }
  void copier_ends_intact() {
    copier_->channel().send("let go");
    EXPECT_EQ(copier_->channel().receive(), "intact");
    copier_->channel().send("exit");
    EXPECT_EQ(copier_->wait(), 0);
  }

  std::unique_ptr<peer_process> copier_;
  tag_data g_;
  std::uint64_t mappings_ = 0;
};

// Given way: 300 ms after the offload returned, none of its mappings is unmapped (the emulator
// copies 120 MiB in a few milliseconds); once the copier's copies end it finishes. Without
// giving way it is done meanwhile.
TEST_F(GiveWay, EarlyOffloadWaitsForTheJobsReloadToCopy) {
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "TAGMEM_HANDOFF_GIVE_WAY=on" : "TAGMEM_HANDOFF_GIVE_WAY=off");
    setenv("TAGMEM_HANDOFF_GIVE_WAY", on ? "on" : "off", 1);
    start_copier();
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    offload_g();
    if (on) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(g_unmapped()) << "the offload copied beside the job's reload";
    } else {
      EXPECT_TRUE(eventually([&] { return g_unmapped(); }))
          << "the offload waited though told not to give way";
    }
    copier_ends_intact();
    reload_g_intact();
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  }
}

// The copier killed while the offload waits for it: its mark goes with it, and the offload ends.
TEST_F(GiveWay, KilledCopierLetsTheOffloadGo) {
  start_copier();
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  offload_g();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(g_unmapped()) << "the offload did not give way";
  ::kill(copier_->pid(), SIGKILL);
  EXPECT_EQ(copier_->wait(), 128 + SIGKILL);
  reload_g_intact();
}

// A copier that copies on past TAGMEM_HANDOFF_TIMEOUT_MS: the offload stops giving way and ends
// while the copier still holds its mark.
TEST_F(GiveWay, GivesWayForAtMostTheHandoffTimeout) {
  setenv("TAGMEM_HANDOFF_TIMEOUT_MS", "400", 1);
  start_copier();
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  offload_g();
  // The copier has not let go (if the offload gave way for good, the copier's release lets it
  // end after the check fails).
  EXPECT_TRUE(eventually([&] { return g_unmapped(); })) << "the offload gave way past the bound";
  copier_ends_intact();
  reload_g_intact();
}

}  // namespace
}  // namespace tagmem::handoff_test
