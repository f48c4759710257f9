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

using HandoffAwait = early_return_test;

// The reload's one run of 60 MiB finds 30 MiB free and nothing held while the giver is still
// handing memory over: it waits for the first handle and maps it beside 30 MiB it creates. Were it
// to try the create at once, it would fail, and the reload would wait for the job's memory
// (counted in reload_waits) without its mark.
TEST_F(HandoffAwait, ARunWaitsForHandlesComingRatherThanRunShort) {
  unsetenv("TAGMEM_OFFLOAD_RETURN");  // this process offloads as usual; the giver returns early
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  setenv("TAGMEM_OFFLOAD_RETURN", "queued", 1);
  auto giver = std::make_unique<peer_process>("slow_giver", "g");
  giver->channel().send(std::to_string(seed_ + 1));
  ASSERT_EQ(giver->channel().receive(), "resident");
  fill_device();
  reliability::emu().set_device_bytes(0, reliability::emu().device_used_bytes(0) + kPiece);
  // This process has offloaded tags, so it takes memory already (TAGMEM_HANDOFF_ANNOUNCE's
  // default): the giver's offload greets it, and its handles are still coming when the reload
  // starts.
  ASSERT_TRUE(eventually([] { return handoff_stats().listening == 1; }));
  giver->channel().send("offload");
  ASSERT_EQ(giver->channel().receive(), "returned");
  {
    reload_thread reloader("w");
    ASSERT_EQ(reloader.finish(), "");
  }
  EXPECT_EQ(corrupted(w), 0u);
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.reload_waits, 0u) << "the reload ran short instead of waiting for the handles";
  EXPECT_GE(s.mapped_received_bytes, kPiece) << "it mapped no handle of the giver";
  reliability::emu().set_device_bytes(0, total_);
  giver->channel().send("reload");
  const std::string reply = giver->channel().receive();  // "intact given <bytes>"
  ASSERT_EQ(reply.rfind("intact given ", 0), 0u) << reply;
  EXPECT_GE(std::stoull(reply.substr(13)), kPiece) << "the giver found no taker: " << reply;
  giver->channel().send("exit");
  EXPECT_EQ(giver->wait(), 0);
}

}  // namespace
}  // namespace tagmem::handoff_test
