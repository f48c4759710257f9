// kill_test.cpp — a process of the job killed (SIGKILL) at a step of a hand-over: the survivor's
// operation succeeds, no byte of its BACKUP tags is lost, and once the dead process is gone its
// memory is free again (the shared emulated GPU's count drops it, as the real driver frees a dead
// process's memory) with nothing left behind in the survivor.
//
// The victim is a peer started with TAGMEM_EMU_KILL_AT=<entry>:<n>: the emulated driver kills it
// at that call; or with HANDOFF_TEST_KILL_AFTER=<frame>:<n> (frame_kill.cpp): it dies right after
// sending that message of the protocol. Or the test kills it between two steps.
#include <gtest/gtest.h>
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

// Gives its DISCARD tag when told (perhaps dying on the way); reports what it gave.
TAGMEM_PEER_SCENARIO(victim_giver) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data kv = fill_tag("kv", 2, kPiece, rng);
  args.channel.send("resident");
  args.channel.expect("offload");
  const char* kv_tag = "kv";
  check(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), "offload kv");
  args.channel.send("given " + std::to_string(handoff_stats().given_bytes));
  args.channel.expect("exit");
  check(tagmem_shutdown(), "tagmem_shutdown");
  return 0;
}

// Takes memory (it has an offloaded BACKUP tag) and reloads when told (perhaps dying on the way).
TAGMEM_PEER_SCENARIO(victim_taker) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data w = fill_tag("w", 2, kPiece, rng);
  const char* w_tag = "w";
  check(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), "offload w");
  args.channel.send("listening");
  args.channel.expect("reload");
  check(tagmem_reload(&w_tag, 1, 0), "reload w");
  args.channel.send(corrupted(w) == 0 ? "intact" : "corrupted");
  args.channel.expect("exit");
  check(tagmem_shutdown(), "tagmem_shutdown");
  return 0;
}

// What this process's service thread has received, once it reaches `expected` or 10 s have
// passed (imports run on that thread, so they may still be under way when the giver is dead).
std::uint64_t received_settled(std::uint64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::uint64_t got = handoff_stats().received_bytes;
  while (got != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    got = handoff_stats().received_bytes;
  }
  return got;
}

class HandoffKill : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    ASSERT_TRUE(reliability::emu().available);
    before_ = take_fd_census();
  }
  void TearDown() override {
    unsetenv("TAGMEM_EMU_KILL_AT");
    unsetenv("HANDOFF_TEST_KILL_AFTER");
    tagmem_shutdown();
    EXPECT_EQ(reliability::emu().device_used_bytes(0), 0u) << "memory of the dead is still used";
    EXPECT_EQ(emu_leaks(), "");
    EXPECT_EQ(take_fd_census(), before_)
        << describe(take_fd_census()) << " / " << describe(before_);
  }
  // kill_at: "<driver entry>:<n>" or, with `after_sending`, "<frame>:<n>".
  std::unique_ptr<peer_process> start(const char* scenario, const char* kill_at,
                                      bool after_sending = false) {
    const char* name = after_sending ? "HANDOFF_TEST_KILL_AFTER" : "TAGMEM_EMU_KILL_AT";
    setenv(name, kill_at, 1);
    auto p = std::make_unique<peer_process>(scenario, "v");
    unsetenv(name);
    p->channel().send(std::to_string(seed_));
    return p;
  }
  // This process takes: its BACKUP tag offloaded, a giver started with `kill_at` offloads its
  // DISCARD tag and dies. What arrived before (`received`) stays, since the session ends with the
  // giver but the taker holds its own reference; the reload maps it and creates the rest, and a
  // second round trip still holds every byte.
  void take_from_dying_giver(const char* kill_at, bool after_sending, std::uint64_t received) {
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    std::mt19937_64 rng(seed_);
    tag_data w = fill_tag("w", 2, kPiece, rng);
    const char* w_tag = "w";
    ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
    auto giver = start("victim_giver", kill_at, after_sending);
    ASSERT_EQ(giver->channel().receive(), "resident");
    giver->channel().send("offload");
    EXPECT_EQ(giver->wait(), 128 + SIGKILL);
    giver.reset();
    EXPECT_EQ(received_settled(received), received);
    for (int round = 0; round < 2; ++round) {
      if (round > 0) {
        ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS)
            << tagmem_last_error();
      }
      ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
      EXPECT_EQ(corrupted(w), 0u) << "round " << round;
    }
  }
  // This process gives: a taker started with `kill_at` listens and dies during the DISCARD
  // offload. What it acknowledged (`given`) is freed with it; the rest goes to the driver, the
  // offload succeeds, and this process's other tags round-trip whole.
  void give_to_dying_taker(const char* kill_at, bool after_sending, std::uint64_t given) {
    auto taker = start("victim_taker", kill_at, after_sending);
    ASSERT_EQ(taker->channel().receive(), "listening");
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    std::mt19937_64 rng(seed_);
    tag_data kv = fill_tag("kv", 2, kPiece, rng);
    tag_data own = fill_tag("own", 2, kPiece, rng);
    const char* kv_tag = "kv";
    ASSERT_EQ(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(handoff_stats().given_bytes, given);
    EXPECT_EQ(taker->wait(), 128 + SIGKILL);
    taker.reset();
    const char* own_tag = "own";
    ASSERT_EQ(tagmem_offload(&own_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
    ASSERT_EQ(tagmem_reload(&own_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(corrupted(own), 0u);
    ASSERT_EQ(tagmem_reload(&kv_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
    ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  }
  std::uint64_t seed_ = 0;
  fd_census before_;
};

// This process takes; the giver dies at its nth export, after n-1 handles were handed over.
class GiverKilled : public HandoffKill, public ::testing::WithParamInterface<int> {};

TEST_P(GiverKilled, TakerKeepsWhatItGotAndReloads) {
  const std::string kill_at = "cuMemExportToShareableHandle:" + std::to_string(GetParam());
  take_from_dying_giver(kill_at.c_str(), false, (GetParam() - 1) * kPiece);
}

INSTANTIATE_TEST_SUITE_P(AtExport, GiverKilled, ::testing::Values(1, 2));

// This process gives; the taker dies importing the first handle, before TAKEN: the offload
// succeeds with its memory going to the driver.
TEST_F(HandoffKill, TakerKilledMidImportLeavesGiverWhole) {
  give_to_dying_taker("cuMemImportFromShareableHandle:1", false, 0);
}

// The taker dies after taking (TAKEN sent), before or while mapping: the giver is unaffected and
// the memory it handed over is free once the taker is gone.
class TakerKilledAfterTaking : public HandoffKill,
                               public ::testing::WithParamInterface<const char*> {};

TEST_P(TakerKilledAfterTaking, GiverUnaffectedAndMemoryFreed) {
  auto taker = start("victim_taker", GetParam());
  ASSERT_EQ(taker->channel().receive(), "listening");
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data kv = fill_tag("kv", 2, kPiece, rng);
  const char* kv_tag = "kv";
  ASSERT_EQ(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(handoff_stats().given_bytes, 2 * kPiece);
  if (std::string(GetParam()).empty()) {
    taker->kill_now();  // killed between taking and mapping
  } else {
    taker->channel().send("reload");  // it dies mapping or copying
    EXPECT_EQ(taker->wait(), 128 + SIGKILL);
  }
  taker.reset();
  ASSERT_EQ(tagmem_reload(&kv_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
}

INSTANTIATE_TEST_SUITE_P(
    Steps, TakerKilledAfterTaking,
    // its first two maps were its allocations'; the third is its reload's
    ::testing::Values("", "cuMemMap:3", "cuMemcpyHtoDAsync:1"), [](const auto& info) {
      return std::string(info.param).empty()
                 ? std::string("before_mapping")
                 : std::string(info.param).substr(0, std::string(info.param).find(':'));
    });

// A process dies right after sending one message of the protocol (frame_kill.cpp).
struct frame_step {
  const char* kill_after;
  std::uint64_t handed;  // what the survivor then has received, or given
};

std::string step_name(const ::testing::TestParamInfo<frame_step>& info) {
  const std::string s = info.param.kill_after;
  return "after_" + s.substr(0, s.find(':'));
}

// This process takes.
class GiverKilledAfterSending : public HandoffKill,
                                public ::testing::WithParamInterface<frame_step> {};

TEST_P(GiverKilledAfterSending, TakerKeepsWhatItGotAndReloads) {
  take_from_dying_giver(GetParam().kill_after, true, GetParam().handed);
}

INSTANTIATE_TEST_SUITE_P(Steps, GiverKilledAfterSending,
                         ::testing::Values(frame_step{"hello:1", 0},      // before the welcome came
                                           frame_step{"give:1", kPiece},  // before its TAKEN came
                                           frame_step{"done:1", 2 * kPiece}),  // all handed over
                         step_name);

// This process gives.
class TakerKilledAfterSending : public HandoffKill,
                                public ::testing::WithParamInterface<frame_step> {};

TEST_P(TakerKilledAfterSending, GiverSucceedsAndMemoryIsFreed) {
  give_to_dying_taker(GetParam().kill_after, true, GetParam().handed);
}

INSTANTIATE_TEST_SUITE_P(Steps, TakerKilledAfterSending,
                         ::testing::Values(frame_step{"welcome:1", 0},  // before any handle came
                                           frame_step{"taken:1", kPiece}),  // one acknowledged
                         step_name);

}  // namespace
}  // namespace tagmem::handoff_test
