// overlap_test.cpp — the RL switch in a full device with the two sides' calls at once: the engine
// (this process) pauses, the trainer (a peer) resumes with the engine's memory, then the trainer
// pauses while the engine resumes. The device holds the engine and nothing more, so the engine's
// resume fits only as the trainer's memory comes back: its reload waits and maps what it gets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <sstream>

#include "emu_controls.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

constexpr std::size_t kEngine = 12 * MiB;  // the engine's mappings; two make one reload run

// The trainer: a BACKUP tag of `count` mappings of `mib` MiB ("<seed> <count> <mib> <paused>"),
// paused at once when `paused` is 1; then resumed and paused when told, checking its bytes after
// each resume and saying after each pause how much it has given to the job so far. It exits with
// no descriptor or mapping left behind.
TAGMEM_PEER_SCENARIO(overlap_trainer) {
  const fd_census before = take_fd_census();
  check(tagmem_init(nullptr), "tagmem_init");
  std::uint64_t seed = 0;
  int count = 0;
  std::size_t mib = 0;
  int paused = 0;
  std::istringstream(args.channel.receive()) >> seed >> count >> mib >> paused;
  std::mt19937_64 rng(seed);
  tag_data t = fill_tag("t", count, mib * MiB, rng);
  const char* t_tag = "t";
  if (paused) {
    check(tagmem_offload(&t_tag, 1, 0, TAGMEM_BACKUP), "pause");
    check(tagmem_wait_released(0), "tagmem_wait_released");
  }
  args.channel.send("ready");
  for (;;) {
    const std::string cmd = args.channel.receive();
    if (cmd == "resume") {
      check(tagmem_reload(&t_tag, 1, 0), "resume");
      args.channel.send(corrupted(t) == 0 ? "intact" : "corrupted");
    } else if (cmd == "pause") {
      check(tagmem_offload(&t_tag, 1, 0, TAGMEM_BACKUP), "pause");
      check(tagmem_wait_released(0), "tagmem_wait_released");
      args.channel.send("paused given " + std::to_string(handoff_stats().given_bytes));
    } else {
      break;
    }
  }
  check(tagmem_shutdown(), "tagmem_shutdown");
  if (!emu_leaks().empty()) return 12;
  return take_fd_census() == before ? 0 : 13;
}

class HandoffOverlap : public shared_device_test {
 protected:
  // The device back to its size; then `peer` resumes from its backup, checks it and exits.
  void resume_and_end(peer_process& peer) {
    reliability::emu().set_device_bytes(0, total_);
    peer.channel().send("resume");
    EXPECT_EQ(peer.channel().receive(), "intact");
    peer.channel().send("exit");
    EXPECT_EQ(peer.wait(), 0);
  }
};

// A -> B -> A: the engine's kv cache goes to the trainer, which maps it as its own; when the
// trainer pauses, the memory goes back to the engine's reload, although the driver does not export
// what the trainer imported: the descriptor it came with goes (Note [one hop]). The device holds
// the engine and nothing more, and both calls of the second switch run at once.
TEST_F(HandoffOverlap, ReceivedMemoryIsHandedOnAgain) {
  peer_process trainer("overlap_trainer", "t");
  trainer.channel().send(std::to_string(seed_ + 1) + " 2 12 1");
  ASSERT_EQ(trainer.channel().receive(), "ready");
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = fill_tag("w", 2, kEngine, rng);
  tag_data kv = fill_tag("kv", 2, kEngine, rng);
  fill_device();
  const char* kv_tag = "kv";
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(handoff_stats().given_bytes, 2 * kEngine) << "the kv cache did not go to the trainer";
  trainer.channel().send("resume");
  ASSERT_EQ(trainer.channel().receive(), "intact");
  trainer.channel().send("pause");
  const char* both[] = {"w", "kv"};
  const tagmem_status reload = tagmem_reload(both, 2, 0);
  const std::string why = tagmem_last_error();
  EXPECT_EQ(trainer.channel().receive(), "paused given " + std::to_string(2 * kEngine));
  ASSERT_EQ(reload, TAGMEM_SUCCESS) << why;
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.received_bytes, 2 * kEngine);
  EXPECT_EQ(s.mapped_received_bytes, 2 * kEngine);
  resume_and_end(trainer);
}

// The trainer's handles (16 MiB) do not tile the engine's runs (24 MiB): a run maps one received
// handle and must create the rest, which a full device refuses. Memory the reload holds and
// cannot use makes that room: the reload maps as the handles arrive instead of waiting out its
// TAGMEM_HANDOFF_WAIT_MS with the trainer's memory in hand.
TEST_F(HandoffOverlap, HandlesThatDoNotTileTheRunsStillFeedTheReload) {
  const tagmem_status init = init_with("TAGMEM_HANDOFF_WAIT_MS", "3000");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = fill_tag("w", 2, kEngine, rng);
  tag_data kv = fill_tag("kv", 2, kEngine, rng);
  const char* kv_tag = "kv";
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  peer_process trainer("overlap_trainer", "t");
  trainer.channel().send(std::to_string(seed_ + 1) + " 3 16 0");
  ASSERT_EQ(trainer.channel().receive(), "ready");
  fill_device();
  trainer.channel().send("pause");
  const char* both[] = {"w", "kv"};
  const tagmem_status reload = tagmem_reload(both, 2, 0);
  const std::string why = tagmem_last_error();
  EXPECT_EQ(trainer.channel().receive().rfind("paused given ", 0), 0u);
  ASSERT_EQ(reload, TAGMEM_SUCCESS) << why;
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.reload_wait_timeouts, 0u);
  EXPECT_GT(s.mapped_received_bytes, 0u);
  resume_and_end(trainer);
}

// The giver's handles (24 MiB) are larger than any of this reload's runs (12 MiB mappings, runs
// of at most 16 MiB), but four of its runs lie side by side: the reload grows a run to each handle
// it holds and maps both, where it used to leave them to the driver and create its memory anew.
TEST_F(HandoffOverlap, HandlesLargerThanTheRunsAreMappedOverAdjacentRuns) {
  const tagmem_status init = init_with("TAGMEM_MAX_MAPPING_BYTES", "16MiB");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 4, 12 * MiB, rng);
  const char* w_tag = "w";
  peer_process giver("overlap_trainer", "t");
  giver.channel().send(std::to_string(seed_ + 1) + " 2 24 0");
  ASSERT_EQ(giver.channel().receive(), "ready");
  fill_device();
  giver.channel().send("pause");
  const tagmem_status reload = tagmem_reload(&w_tag, 1, 0);
  const std::string why = tagmem_last_error();
  EXPECT_EQ(giver.channel().receive().rfind("paused given ", 0), 0u);
  ASSERT_EQ(reload, TAGMEM_SUCCESS) << why;
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.reload_wait_timeouts, 0u);
  EXPECT_EQ(s.mapped_received_bytes, 2 * 24 * MiB);
  resume_and_end(giver);
}

// The giver's handles (18 MiB) against this reload's runs of 12 MiB side by side: grown only to
// the first length one handle fits in (24 MiB), each run would map one handle and create 6 MiB,
// which a full device refuses until a held handle goes to the driver for room; grown to the length
// whose handles leave the least to create (36 MiB, two handles), the reload maps all four handles
// and creates nothing (Note [runs grow to the handles held]).
TEST_F(HandoffOverlap, RunsGrowToTheLengthTheHeldHandlesTile) {
  const tagmem_status init = init_with("TAGMEM_MAX_MAPPING_BYTES", "12MiB");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 6, 12 * MiB, rng);
  const char* w_tag = "w";
  peer_process giver("overlap_trainer", "t");
  giver.channel().send(std::to_string(seed_ + 1) + " 4 18 0");
  ASSERT_EQ(giver.channel().receive(), "ready");
  giver.channel().send("pause");
  ASSERT_EQ(giver.channel().receive(), "paused given " + std::to_string(72 * MiB));
  ASSERT_TRUE(eventually([] { return handoff_stats().held_bytes == 72 * MiB; }));
  fill_device();
  const std::uint64_t creates = emu_calls("cuMemCreate");
  const tagmem_status reload = tagmem_reload(&w_tag, 1, 0);
  ASSERT_EQ(reload, TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_EQ(emu_calls("cuMemCreate"), creates) << "the reload created memory";
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.mapped_received_bytes, 72 * MiB);
  EXPECT_EQ(s.returned_bytes, 0u);
  resume_and_end(giver);
}

}  // namespace
}  // namespace tagmem::handoff_test
