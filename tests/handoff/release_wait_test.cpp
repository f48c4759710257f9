// release_wait_test.cpp — what a giver's offload hands to nobody waits in its release queue while
// a process of the job copies a reload on the GPU, and goes once those copies end (Note [releases
// wait for copies] in device/release_queue.hpp); the copy marks behind it (copy_gate.hpp) are seen
// across processes (and told apart from this process's own), and a copier that dies holds nobody
// back.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "emu_controls.hpp"
#include "handoff/copy_gate.hpp"
#include "handoff/handoff_point.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

using handoff::copy_gate;
using handoff::gpu_uuid;
using handoff::list_copy_marks;

std::uint64_t release_pending() {
  tagmem_device_stats ds{};
  check(tagmem_device_stats_get(0, &ds), "tagmem_device_stats_get");
  return ds.release_pending_bytes;
}

// A giver of four 30 MiB mappings (BACKUP or DISCARD, as told), more than the test's reload
// wants: it offloads when told, then answers "pending" with its bytes not yet back with the
// driver until told to reload (BACKUP: every byte checked) or to exit.
TAGMEM_PEER_SCENARIO(leftover_giver) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  const bool backup = args.channel.receive() == "backup";
  tag_data g = fill_tag("g", 4, kPiece, rng);
  args.channel.send("resident");
  args.channel.expect("offload");
  const char* g_tag = "g";
  check(tagmem_offload(&g_tag, 1, 0, backup ? TAGMEM_BACKUP : TAGMEM_DISCARD), "offload g");
  args.channel.send("given " + std::to_string(handoff_stats().given_bytes));
  for (std::string cmd = args.channel.receive(); cmd != "exit"; cmd = args.channel.receive()) {
    if (cmd == "pending") {
      args.channel.send(std::to_string(release_pending()));
    } else if (cmd == "reload") {
      check(tagmem_reload(&g_tag, 1, 0), "reload g");
      args.channel.send(corrupted(g) == 0 ? "intact" : "corrupted");
    }
  }
  check(tagmem_shutdown(), "tagmem_shutdown");
  return emu_leaks().empty() ? 0 : 12;
}

class HandoffReleaseWait : public shared_device_test,
                           public ::testing::WithParamInterface<tagmem_offload_mode> {};
class HandoffReleaseWaitNone : public shared_device_test {};

// This process reloads 60 MiB with one copy held by the emulator, so that it stays in its copies
// with every run mapped; the giver offloads 120 MiB meanwhile, of which this process takes what
// its reload announced. The rest stays in the giver's release queue while the copy is held
// (without the wait, a DISCARD offload's background release and a BACKUP offload's own release
// would have given it back at once), and goes once the reload is done.
TEST_P(HandoffReleaseWait, LeftoversWaitForTheReloadsCopies) {
  const bool backup = GetParam() == TAGMEM_BACKUP;
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);
  peer_process giver("leftover_giver", "g");
  giver.channel().send(std::to_string(seed_));
  giver.channel().send(backup ? "backup" : "discard");
  ASSERT_EQ(giver.channel().receive(), "resident");
  std::string given;
  {
    reliability::emu().hold_next_h2d_copy();
    reload_thread reloader("w");
    const char* dir = std::getenv("TAGMEM_PEER_DIR");
    ASSERT_NE(dir, nullptr);
    // The reload's mark: its runs are mapped and its copies queued, one of them held.
    EXPECT_TRUE(eventually([&] { return copy_mark_held(dir); }));
    giver.channel().send("offload");
    given = giver.channel().receive();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    giver.channel().send("pending");
    const std::uint64_t pending = std::stoull(giver.channel().receive());
    const std::uint64_t handed = std::stoull(given.substr(6));
    EXPECT_LE(handed, 2 * kPiece) << "more than the reload wanted was handed over";
    EXPECT_EQ(pending, 4 * kPiece - handed)
        << "what nobody took did not wait for the reload's copies";
    reliability::emu().release_held_copy();
    ASSERT_EQ(reloader.finish(), "");
  }
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_TRUE(eventually([&] {
    giver.channel().send("pending");
    return giver.channel().receive() == "0";
  })) << "the leftovers did not go once the reload was done";
  if (backup) {
    giver.channel().send("reload");
    EXPECT_EQ(giver.channel().receive(), "intact");
  }
  giver.channel().send("exit");
  EXPECT_EQ(giver.wait(), 0);
}

// Nobody copies: a BACKUP offload releases what nobody takes on the spot, as without handoff (the
// offload returns with it back with the driver).
TEST_F(HandoffReleaseWaitNone, BackupLeftoversGoAtOnceWhenNobodyCopies) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data w = offloaded_backup("w", 2, kPiece, rng);  // takes up to its 60 MiB, not reloading
  peer_process giver("leftover_giver", "g");
  giver.channel().send(std::to_string(seed_));
  giver.channel().send("backup");
  ASSERT_EQ(giver.channel().receive(), "resident");
  giver.channel().send("offload");
  const std::string given = giver.channel().receive();
  giver.channel().send("pending");
  EXPECT_EQ(giver.channel().receive(), "0") << "leftovers waited though nobody copied";
  EXPECT_EQ(given, "given " + std::to_string(2 * kPiece));
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
  giver.channel().send("reload");
  EXPECT_EQ(giver.channel().receive(), "intact");
  giver.channel().send("exit");
  EXPECT_EQ(giver.wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, HandoffReleaseWait,
                         ::testing::Values(TAGMEM_DISCARD, TAGMEM_BACKUP), [](const auto& info) {
                           return std::string(info.param == TAGMEM_BACKUP ? "Backup" : "Discard");
                         });

void marks_seen_across_processes(const std::string& dir, const gpu_uuid& uuid);

// The marks themselves, without a GPU: a mark held by another process is seen, one held by this
// process is seen too (its own releases slow its own copies alike), and a copier killed while it
// holds its mark holds nobody back; the first process to look removes its file.
TEST(HandoffCopyGate, MarksAreSeenAcrossProcessesAndDieWithTheirOwner) {
  const std::string dir = make_private_dir("copy-gate");
  const gpu_uuid uuid{};
  marks_seen_across_processes(dir, uuid);
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "a mark was left in " << dir;
}

void marks_seen_across_processes(const std::string& dir, const gpu_uuid& uuid) {
  copy_gate mine(dir, "job-a", uuid);
  release_gate& probe = mine;
  EXPECT_FALSE(probe.copies_running());
  mine.begin();
  EXPECT_TRUE(probe.copies_running()) << "this process's own mark";
  EXPECT_FALSE(mine.others_copying()) << "this process's own mark counted as another's";
  mine.end();
  EXPECT_FALSE(probe.copies_running());

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    copy_gate theirs(dir, "job-a", uuid);
    theirs.begin();
    const char c = 'm';
    [[maybe_unused]] ssize_t n = ::write(ready[1], &c, 1);
    for (;;) ::pause();  // killed while it holds the mark
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_TRUE(probe.copies_running()) << "another process's mark";
  EXPECT_TRUE(mine.others_copying()) << "another process's mark";
  copy_gate other_job(dir, "job-b", uuid);
  EXPECT_FALSE(static_cast<release_gate&>(other_job).copies_running())
      << "a mark of another job counted";
  std::string path;  // the child's mark (this process's is listed too)
  for (const auto& [p, pid] : list_copy_marks(dir, "job-a", uuid)) {
    if (pid == child) path = p;
  }
  ASSERT_FALSE(path.empty()) << "the child's mark is not listed";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(probe.copies_running()) << "a dead process's mark held the releases back";
  EXPECT_FALSE(mine.others_copying()) << "a dead process's mark counted";
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the dead process's mark was left: " << path;
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace tagmem::handoff_test
