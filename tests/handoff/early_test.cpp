// early_test.cpp — offloads that return once their copies are queued (TAGMEM_OFFLOAD_RETURN=queued,
// Note [early return] in allocator/registry/early_offloads.hpp): the call returns before anything
// is unmapped, touching the tag waits for the end, a failure before the copies are queued is the
// call's and one after is tagmem_wait_released's, a process that exits meanwhile still finishes
// handing its memory to the job's reload that waits for it, and a giver or taker killed while the
// offload drains costs no byte of a BACKUP tag and leaves nothing behind (three processes too).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "emu_controls.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

using EarlyReturn = early_return_test;

// The copies run at 8 MiB/s, so the offload of 24 MiB needs 3 s: the call returns with every
// mapping still in place, and the reload that follows waits for the offload's end, then restores
// every byte.
TEST_F(EarlyReturn, ReturnsBeforeUnmappingAndTouchingWaits) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = fill_tag("w", 3, 8 * MiB, rng);
  const char* w_tag = "w";
  const std::uint64_t mappings = reliability::emu().live_mappings();
  reliability::emu().set_copy_bytes_per_second(8 * MiB);
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(reliability::emu().live_mappings(), mappings)
      << "the offload unmapped before returning";
  reliability::emu().set_copy_bytes_per_second(0);
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
  tagmem_tag_stats ts{};
  ASSERT_EQ(tagmem_tag_stats_get("w", 0, &ts), TAGMEM_SUCCESS);
  EXPECT_EQ(ts.state, TAGMEM_RESIDENT);
  EXPECT_EQ(ts.offload_count, 1u);
  // tagmem_wait_released waits for the end; the tag is offloaded then.
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_LT(reliability::emu().live_mappings(), mappings) << "nothing unmapped once it ended";
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
}

// A failure found before the copies are queued is the call's own: the tag is as it was.
TEST_F(EarlyReturn, RefusalBeforeQueueingIsTheCalls) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = fill_tag("w", 2, 4 * MiB, rng);
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_TAG_OFFLOADED);
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
}

// A failure after the call returned (an unmap the driver refuses) leaves the tag resident with its
// bytes, as without early return, and the next tagmem_wait_released reports it, once.
TEST_F(EarlyReturn, FailureAfterReturningIsReportedByWaitReleased) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = fill_tag("w", 2, 4 * MiB, rng);
  const char* w_tag = "w";
  ASSERT_EQ(reliability::emu().fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN), 0);
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_NE(tagmem_wait_released(0), TAGMEM_SUCCESS);
  EXPECT_NE(std::string(tagmem_last_error()).find("cuMemUnmap"), std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  tagmem_tag_stats ts{};
  ASSERT_EQ(tagmem_tag_stats_get("w", 0, &ts), TAGMEM_SUCCESS);
  EXPECT_EQ(ts.state, TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(w), 0u);
}

// A giver whose offload returns early: it says so, then either exits at once, without
// tagmem_shutdown (its atexit handler finishes the offload), or reloads and checks its tag.
TAGMEM_PEER_SCENARIO(early_giver) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data g = fill_tag("g", 2, kPiece, rng);
  args.channel.send("resident");
  args.channel.expect("offload");
  const char* g_tag = "g";
  check(tagmem_offload(&g_tag, 1, 0, TAGMEM_BACKUP), "offload g");
  args.channel.send("returned");
  if (args.channel.receive() == "exit_now") return 0;  // exit(): the atexit handler waits
  check(tagmem_reload(&g_tag, 1, 0), "reload g");
  args.channel.send(corrupted(g) == 0 ? "intact" : "corrupted");
  args.channel.expect("exit");
  check(tagmem_shutdown(), "tagmem_shutdown");
  return emu_leaks().empty() ? 0 : 12;
}

// A giver whose offload returns early says so and exits at once, without tagmem_shutdown; its
// atexit handler finishes the offload, handing its memory to the reload that waits for it. The
// giver's handles (30 MiB) are smaller than the reload's run (60 MiB): the first one waits in the
// reload's hands for the second, and both are mapped, none created.
TEST_F(EarlyReturn, ExitingGiverStillHandsItsMemory) {
  // The taker takes only while reloading.
  const tagmem_status init = init_with("TAGMEM_HANDOFF_ANNOUNCE", "reload");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  unsetenv("TAGMEM_OFFLOAD_RETURN");  // this process offloads as usual; the giver returns early
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  setenv("TAGMEM_OFFLOAD_RETURN", "queued", 1);
  auto giver = std::make_unique<peer_process>("early_giver", "g");
  giver->channel().send(std::to_string(seed_ + 1));
  ASSERT_EQ(giver->channel().receive(), "resident");
  fill_device();
  reload_thread reloader("w");
  EXPECT_TRUE(eventually([] { return handoff_stats().listening == 1; }));
  giver->channel().send("offload");
  EXPECT_EQ(giver->channel().receive(), "returned");
  giver->channel().send("exit_now");
  EXPECT_EQ(giver->wait(), 0);
  ASSERT_EQ(reloader.finish(), "");
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.received_bytes, 2 * kPiece);
  EXPECT_EQ(s.mapped_received_bytes, 2 * kPiece);
}

// Three processes: this one reloads 120 MiB on a full device; giver A, returning early, is killed
// at its second export, after handing over one 30 MiB handle (its other 30 MiB go back with it);
// giver B then hands over both of its handles. The reload maps the three handles, creates the
// 30 MiB A left to the driver, and restores every byte; B's own tag comes back whole.
TEST_F(EarlyReturn, GiverKilledWhileDrainingAndAnotherGiverFinishes) {
  const tagmem_status init = init_with("TAGMEM_HANDOFF_ANNOUNCE", "reload");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 4, kPiece, rng);
  auto a = std::make_unique<peer_process>(
      "early_giver", "a",
      std::vector<std::string>{"TAGMEM_EMU_KILL_AT=cuMemExportToShareableHandle:2"});
  auto b = std::make_unique<peer_process>("early_giver", "b");
  a->channel().send(std::to_string(seed_ + 1));
  b->channel().send(std::to_string(seed_ + 2));
  ASSERT_EQ(a->channel().receive(), "resident");
  ASSERT_EQ(b->channel().receive(), "resident");
  fill_device();
  reload_thread reloader("w");
  EXPECT_TRUE(eventually([] { return handoff_stats().listening == 1; }));
  a->channel().send("offload");  // it may die before or after saying "returned"
  EXPECT_EQ(a->wait(), 128 + SIGKILL);
  a.reset();
  b->channel().send("offload");
  EXPECT_EQ(b->channel().receive(), "returned");
  ASSERT_EQ(reloader.finish(), "");
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.received_bytes, 3 * kPiece);
  EXPECT_EQ(s.mapped_received_bytes, 3 * kPiece);
  reliability::emu().set_device_bytes(0, total_);
  b->channel().send("check");
  EXPECT_EQ(b->channel().receive(), "intact");
  b->channel().send("exit");
  EXPECT_EQ(b->wait(), 0);
}

// The taker dies importing the first handle of an offload that returned early: the offload's
// thread finds the session gone, gives its memory to the driver and ends without a failure; the
// tag comes back whole.
TEST_F(EarlyReturn, TakerKilledWhileTheOffloadDrains) {
  peer_process taker(
      "victim_taker", "t",
      {"TAGMEM_EMU_KILL_AT=cuMemImportFromShareableHandle:1", "TAGMEM_OFFLOAD_RETURN=done"});
  taker.channel().send(std::to_string(seed_ + 1));
  ASSERT_EQ(taker.channel().receive(), "listening");
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data own = fill_tag("own", 2, kPiece, rng);
  const char* own_tag = "own";
  ASSERT_EQ(tagmem_offload(&own_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(taker.wait(), 128 + SIGKILL);
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(handoff_stats().given_bytes, 0u);
  ASSERT_EQ(tagmem_reload(&own_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(own), 0u);
}

}  // namespace
}  // namespace tagmem::handoff_test
