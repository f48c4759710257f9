// await_test.cpp — a reload whose run would create more than the device has free, while a process
// of the job is still handing memory to it, waits for the next handle instead of failing to
// create and waiting for the job's memory (Note [handles before creates] in
// allocator/offload/offload_engine.cpp): it never runs short, so its copy mark stays and the
// giver's leftovers wait. The processes share one emulated GPU (TAGMEM_EMU_SHARED_DEVICES).
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "emu_controls.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

// A giver of three 30 MiB mappings whose offload returns once its copies are queued and then
// copies at 100 MiB/s, handing a mapping over about every 0.3 s; told so, it reloads its tag and
// checks every byte.
TAGMEM_PEER_SCENARIO(slow_giver) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data g = fill_tag("g", 3, kPiece, rng);
  args.channel.send("resident");
  args.channel.expect("offload");
  reliability::emu().set_copy_bytes_per_second(100 * MiB);
  const char* g_tag = "g";
  check(tagmem_offload(&g_tag, 1, 0, TAGMEM_BACKUP), "offload g");
  args.channel.send("returned");
  args.channel.expect("reload");
  reliability::emu().set_copy_bytes_per_second(0);
  check(tagmem_reload(&g_tag, 1, 0), "reload g");
  args.channel.send(std::string(corrupted(g) == 0 ? "intact" : "corrupted") + " given " +
                    std::to_string(handoff_stats().given_bytes));
  args.channel.expect("exit");
  check(tagmem_shutdown(), "tagmem_shutdown");
  return emu_leaks().empty() ? 0 : 12;
}

class HandoffAwait : public early_return_test {
 protected:
  // Offloads this process's tag `w` (two pieces, BACKUP), has a slow giver offload its tag with
  // early return, and leaves the device room for one piece: a reload of `w` finds the giver's
  // handles still coming. Failures are the test's (check HasFatalFailure()).
  void offload_beside_a_slow_giver() {
    unsetenv("TAGMEM_OFFLOAD_RETURN");  // this process offloads as usual; the giver returns early
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    std::mt19937_64 rng(seed_);
    w_ = offloaded_backup("w", 2, kPiece, rng);
    setenv("TAGMEM_OFFLOAD_RETURN", "queued", 1);
    giver_ = std::make_unique<peer_process>("slow_giver", "g");
    giver_->channel().send(std::to_string(seed_ + 1));
    ASSERT_EQ(giver_->channel().receive(), "resident");
    fill_device();
    reliability::emu().set_device_bytes(0, reliability::emu().device_used_bytes(0) + kPiece);
    // This process has offloaded tags, so it takes memory already (TAGMEM_HANDOFF_ANNOUNCE's
    // default): the giver's offload greets it, and its handles are still coming when the reload
    // starts.
    ASSERT_TRUE(eventually([] { return handoff_stats().listening == 1; }));
    giver_->channel().send("offload");
    ASSERT_EQ(giver_->channel().receive(), "returned");
  }
  // After the reload: every byte of `w`, no wait for the job's memory, the giver's tag intact
  // once it reloads, and at least one of its handles taken.
  void check_and_end() {
    EXPECT_EQ(corrupted(w_), 0u);
    EXPECT_EQ(handoff_stats().reload_waits, 0u)
        << "the reload ran short instead of waiting for the handles";
    reliability::emu().set_device_bytes(0, total_);
    giver_->channel().send("reload");
    const std::string reply = giver_->channel().receive();  // "intact given <bytes>"
    ASSERT_EQ(reply.rfind("intact given ", 0), 0u) << reply;
    EXPECT_GE(std::stoull(reply.substr(13)), kPiece) << "the giver found no taker: " << reply;
    giver_->channel().send("exit");
    EXPECT_EQ(giver_->wait(), 0);
  }
  void TearDown() override {
    giver_.reset();  // killed if still running; its channel closed before the fixture counts fds
    early_return_test::TearDown();
  }
  tag_data w_;
  std::unique_ptr<peer_process> giver_;
};

// The reload's one run of 60 MiB finds 30 MiB free and nothing held while the giver is still
// handing memory over: it waits for the first handle and maps it beside 30 MiB it creates. Were it
// to try the create at once, it would fail, and the reload would wait for the job's memory
// (counted in reload_waits) without its mark.
TEST_F(HandoffAwait, ARunWaitsForHandlesComingRatherThanRunShort) {
  offload_beside_a_slow_giver();
  if (HasFatalFailure()) return;
  {
    reload_thread reloader("w");
    ASSERT_EQ(reloader.finish(), "");
  }
  EXPECT_GE(handoff_stats().mapped_received_bytes, kPiece) << "it mapped no handle of the giver";
  check_and_end();
}

// The same reload, its first map held by the emulator: once the handle it waited for arrives, the
// run maps it and creates the rest, and the reload holds its mark again while it does (it let the
// mark go while it waited), so that the giver's leftovers do not go to the driver beside its
// copies meanwhile.
TEST_F(HandoffAwait, ARunThatStopsWaitingMarksBeforeItMaps) {
  const char* dir = std::getenv("TAGMEM_PEER_DIR");
  ASSERT_NE(dir, nullptr);
  offload_beside_a_slow_giver();
  if (HasFatalFailure()) return;
  const std::uint64_t maps = emu_calls("cuMemMap");
  reliability::emu().hold_next_map();
  {
    reload_thread reloader("w");
    const bool mapping = eventually([&] { return emu_calls("cuMemMap") > maps; });
    const bool marked = mapping && eventually([&] { return copy_mark_held(dir); });
    reliability::emu().release_held_map();
    EXPECT_TRUE(mapping) << "the reload never mapped";
    EXPECT_TRUE(marked) << "the run mapped without the reload's mark after waiting for handles";
    ASSERT_EQ(reloader.finish(), "");
  }
  check_and_end();
}

}  // namespace
}  // namespace tagmem::handoff_test
