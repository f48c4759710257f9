// wait_test.cpp — a reload that does not fit waits, within TAGMEM_HANDOFF_WAIT_MS, for memory the
// job's processes give back (Note [reload waits for peers]); memory received and never mapped
// goes back to the driver after TAGMEM_HANDOFF_HOLD_MS. The processes share one emulated GPU
// (TAGMEM_EMU_SHARED_DEVICES), so a full device is full for all of them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "api/runtime.hpp"
#include "device/physical_flow.hpp"
#include "emu_controls.hpp"
#include "handoff/inbox.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

// A giver: resident DISCARD tag of two mappings, offloaded when told; exits when told.
TAGMEM_PEER_SCENARIO(resident_giver) {
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
  return emu_leaks().empty() ? 0 : 12;
}

class HandoffWait : public shared_device_test {};

// The reload starts on a full device, waits, and maps what the giver hands it as it arrives.
TEST_F(HandoffWait, ReloadWaitsForMemoryGivenBack) {
  // It takes memory only while reloading.
  const tagmem_status init = init_with("TAGMEM_HANDOFF_ANNOUNCE", "reload");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  auto giver = std::make_unique<peer_process>("resident_giver", "g");
  giver->channel().send(std::to_string(seed_));
  ASSERT_EQ(giver->channel().receive(), "resident");
  fill_device();
  EXPECT_EQ(handoff_stats().listening, 0);

  reload_thread reloader("w");
  // Once it waits (it listens while reloading), the giver offloads.
  EXPECT_TRUE(eventually([] { return handoff_stats().listening == 1; }));
  giver->channel().send("offload");
  EXPECT_EQ(giver->channel().receive(), "given " + std::to_string(2 * kPiece));
  ASSERT_EQ(reloader.finish(), "");
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.received_bytes, 2 * kPiece);
  EXPECT_EQ(s.reload_waits, 1u);
  EXPECT_EQ(s.reload_wait_timeouts, 0u);
  giver->channel().send("exit");
  EXPECT_EQ(giver->wait(), 0);
}

// A reload whose first run fits and whose second waits for memory (two runs of 64 MiB, room for
// one): the first run's pieces that its copy lanes could not take at once (64 pieces of 1 MiB;
// the two lanes hold 16 each) are handed out while it waits, not only once the wait is over.
// Copies run at 100 MiB/s a stream, so the lanes are still full when the wait begins.
TEST_F(HandoffWait, QueuedPiecesCopyWhileTheReloadWaits) {
  setenv("TAGMEM_COPY_PIECE_BYTES", "1MiB", 1);
  const tagmem_status init = init_with("TAGMEM_MAX_MAPPING_BYTES", "64MiB");
  unsetenv("TAGMEM_COPY_PIECE_BYTES");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, 64 * MiB, rng);
  fill_device();
  reliability::emu().set_device_bytes(0, reliability::emu().device_used_bytes(0) + 64 * MiB);
  reliability::emu().set_copy_bytes_per_second(100 * MiB);
  const std::uint64_t before = emu_calls("cuMemcpyHtoDAsync");
  {
    reload_thread reloader("w");
    EXPECT_TRUE(eventually([&] { return emu_calls("cuMemcpyHtoDAsync") - before >= 64; }))
        << "the first run's pieces were not handed out while the reload waited: "
        << emu_calls("cuMemcpyHtoDAsync") - before << " of 64";
    reliability::emu().set_device_bytes(0, total_);  // room for the second run
    ASSERT_EQ(reloader.finish(), "");
  }
  // It waited, and its wait ended with the room made above: the pieces went while it waited.
  EXPECT_EQ(handoff_stats().reload_waits, 1u) << "the reload did not wait";
  EXPECT_EQ(handoff_stats().reload_wait_timeouts, 0u);
  reliability::emu().set_copy_bytes_per_second(0);
  EXPECT_EQ(corrupted(w), 0u);
}

// The run that ran short maps on the very next try, made at once because a run before it had just
// mapped (three runs of one mapping; the second's create fails once, as on a device that was full
// for an instant): its wait ends there and is counted, rather than lasting, unseen, to the end of
// the reload, whose copy mark it would keep away meanwhile (Note [copying in hand]).
TEST_F(HandoffWait, ARunThatMapsOnTheNextTryEndsTheWait) {
  ASSERT_EQ(init_with("TAGMEM_MAX_MAPPING_BYTES", "30MiB"), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 3, kPiece, rng);
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS);  // nothing pending: the create fails out
  ASSERT_EQ(reliability::emu().fail_call("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY), 0);
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  reliability::emu().clear_faults();
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.reload_waits, 1u) << "the wait that the next try ended was never over";
  EXPECT_EQ(s.reload_wait_timeouts, 0u);
}

// Nobody gives: OUT_OF_MEMORY once the wait is over, naming it; the tag keeps its backup and
// reloads every byte once there is room.
TEST_F(HandoffWait, ReloadWaitTimesOutWithBackupIntact) {
  const tagmem_status init = init_with("TAGMEM_HANDOFF_WAIT_MS", "200");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  const char* w_tag = "w";
  fill_device();
  EXPECT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(tagmem_last_error()).find("TAGMEM_HANDOFF_WAIT_MS"), std::string::npos)
      << tagmem_last_error();
  tagmem_tag_stats ts{};
  ASSERT_EQ(tagmem_tag_stats_get("w", 0, &ts), TAGMEM_SUCCESS);
  EXPECT_EQ(ts.state, TAGMEM_OFFLOADED_BACKUP);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.reload_waits, 1u);
  EXPECT_EQ(s.reload_wait_timeouts, 1u);
  reliability::emu().set_device_bytes(0, total_);
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
}

// Memory handed to a process that never reloads goes back to the driver once held long enough.
TEST_F(HandoffWait, ReceiverThatNeverMapsGivesBackAfterHold) {
  const tagmem_status init = init_with("TAGMEM_HANDOFF_HOLD_MS", "300");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  const char* w_tag = "w";
  {
    peer_process giver("resident_giver", "g");
    giver.channel().send(std::to_string(seed_));
    ASSERT_EQ(giver.channel().receive(), "resident");
    giver.channel().send("offload");
    EXPECT_EQ(giver.channel().receive(), "given " + std::to_string(2 * kPiece));
    giver.channel().send("exit");
    EXPECT_EQ(giver.wait(), 0);
  }
  EXPECT_TRUE(eventually([] { return handoff_stats().held_bytes == 0; }));
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.returned_bytes, 2 * kPiece);
  EXPECT_EQ(s.mapped_received_bytes, 0u);
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS);
  EXPECT_EQ(reliability::emu().device_used_bytes(0), 0u) << "held memory still counted";
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
}

// The process's held handles, with `late` arriving among them right after a run has taken what
// fitted: a handle that arrives while the run creates the rest.
class arriving_late final : public physical_source {
 public:
  arriving_late(physical_source& held, physical_part late)
      : held_(static_cast<handoff::inbox&>(held)), late_(late) {}

 private:
  void do_take_up_to(std::size_t bytes, meta_vector<physical_part>& out) override {
    held_.take_up_to(bytes, out);
    if (late_.handle != 0 && held_.put(late_, -1)) late_ = {};
  }
  std::size_t do_would_take(std::size_t bytes) const noexcept override {
    return held_.would_take(bytes);
  }
  bool do_put_back(const physical_part& p) noexcept override { return held_.put_back(p); }
  void do_mapped(std::size_t bytes) noexcept override { held_.mapped(bytes); }
  std::uint64_t do_arrivals() const noexcept override { return held_.arrivals(); }
  bool do_release_one(std::size_t bytes, std::uint64_t seen) noexcept override {
    return held_.release_one(bytes, seen);
  }
  std::size_t do_bytes() const noexcept override { return held_.bytes(); }
  std::size_t do_largest() const noexcept override { return held_.largest(); }

  handoff::inbox& held_;
  physical_part late_;
};

class HandoffArrival : public shared_device_test,
                       public ::testing::WithParamInterface<std::size_t> {};

// A run of 4 MiB on a full device holds one received handle of 2 MiB; another arrives while the
// run tries to create the 2 MiB left: one of 2 MiB, which fits, or of 4 MiB, to which a reload's
// run may grow (Note [runs grow to the handles held]). That try fails, and the handle that arrived
// stays held for the next try, which maps received memory only. It used to go to the driver to
// make room, and the run created its memory from it: the giver's memory went back to the driver
// and came out again (seen as a reload that mapped one of two handles given to it).
TEST_P(HandoffArrival, HandleArrivingDuringATryIsLeftForTheNext) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  constexpr std::size_t run = 4 * MiB;
  const std::size_t late_size = GetParam();
  runtime::hold h;
  device& dev = h.dev(0);
  ASSERT_NE(dev.peers(), nullptr) << "handoff is off";
  context_guard guard(dev.context());
  const auto& api = driver::api();
  CUmemGenericAllocationHandle early = 0, late = 0;
  ASSERT_EQ(api.cuMemCreate(&early, 2 * MiB, &dev.allocation_prop(), 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuMemCreate(&late, late_size, &dev.allocation_prop(), 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(api.cuMemAddressReserve(&va, run, 0, 0, 0), CUDA_SUCCESS);
  fill_device();
  physical_source& held = dev.peers()->held();
  ASSERT_TRUE(held.put_back({early, 2 * MiB}));
  arriving_late source(held, {late, late_size});
  room_leave room;
  room.arrivals_seen = held.arrivals();
  try {
    const auto parts = map_parts(dev, va, run, false, &source, &room);
    ADD_FAILURE() << "the run was mapped with memory created from a handle that arrived";
    unmap_parts(dev, va, run, parts, false);
  } catch (const error& e) {
    EXPECT_EQ(e.code(), TAGMEM_ERROR_OUT_OF_MEMORY) << e.what();
    EXPECT_EQ(held.bytes(), 2 * MiB + late_size) << "a handle held was not kept for the next try";
    EXPECT_TRUE(room.allowed);
    room.arrivals_seen = held.arrivals();
    const std::uint64_t creates = emu_calls("cuMemCreate");
    const auto parts = map_parts(dev, va, run, false, &source, &room);
    EXPECT_EQ(emu_calls("cuMemCreate"), creates) << "the next try created memory";
    unmap_parts(dev, va, run, parts, false);
  }
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.returned_bytes, 0u);
  EXPECT_EQ(s.mapped_received_bytes, run);
  EXPECT_EQ(api.cuMemAddressFree(va, run), CUDA_SUCCESS);
}

INSTANTIATE_TEST_SUITE_P(Sizes, HandoffArrival, ::testing::Values(2 * MiB, 4 * MiB),
                         [](const auto& info) {
                           return info.param == 2 * MiB ? std::string("fits_the_rest")
                                                        : std::string("fits_a_grown_run");
                         });

}  // namespace
}  // namespace tagmem::handoff_test
