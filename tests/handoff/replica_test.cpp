// replica_test.cpp — replicated tags (Note [replicated offload] in replica/replica_tier.hpp): two
// or three processes of one job hold the same tag; each offload copies its share into one shared
// host copy, each reload copies all of it back. The test process is rank 0, peers of this binary
// the other ranks. Every byte is checked after reload in every process, replicas that differ are
// refused, a replica killed (SIGKILL) at each step loses no byte of the others, and nothing is
// left behind (descriptors, mappings, emulated device memory).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>

#include "driver/driver.hpp"
#include "emu_controls.hpp"
#include "harness.hpp"
#include "peer.hpp"

namespace tagmem::handoff_test {
namespace {

using preload_test::peer_args;
using preload_test::peer_process;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr int kCount = 3;  // allocations of kBytes: one 20 MiB segment
constexpr std::size_t kBytes = 3 * MiB;
constexpr const char* kTag = "w";
constexpr std::size_t kHeader = 16 * 1024;  // the shared copy's header

tagmem_tag_stats stats_of(const char* tag) {
  tagmem_tag_stats s{};
  check(tagmem_tag_stats_get(tag, 0, &s), "tagmem_tag_stats_get");
  return s;
}

// A replica: fills the tag from the seed it is sent, offloads and reloads when told, reporting
// each outcome ("<status> <bytes this process copied out> <host bytes>").
TAGMEM_PEER_SCENARIO(replica) {
  check(tagmem_init(nullptr), "tagmem_init");
  std::istringstream in(args.channel.receive());
  std::uint64_t seed = 0;
  int rank = 0, size = 0, count = 0;
  std::string group;
  in >> seed >> rank >> size >> count >> group;
  std::mt19937_64 rng(seed);
  tag_data w = fill_tag(kTag, count, kBytes, rng);
  check(tagmem_set_replicated(kTag, 0, group.c_str(), rank, size), "tagmem_set_replicated");
  args.channel.send("resident");
  for (;;) {
    const std::string cmd = args.channel.receive();
    if (cmd == "exit") break;
    if (cmd.rfind("refill ", 0) == 0) {
      refill(w, std::stoull(cmd.substr(7)));
      args.channel.send("refilled");
      continue;
    }
    const char* tag = kTag;
    const tagmem_status st =
        cmd == "offload" ? tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP) : tagmem_reload(&tag, 1, 0);
    const tagmem_tag_stats s = stats_of(kTag);
    std::string report = std::to_string(st) + " " + std::to_string(s.bytes_offloaded) + " " +
                         std::to_string(s.host_bytes) + " " + std::to_string(s.mapped_bytes);
    if (cmd == "reload" && st == TAGMEM_SUCCESS) report += corrupted(w) == 0 ? " intact" : " bad";
    args.channel.send(report);
  }
  check(tagmem_shutdown(), "tagmem_shutdown");
  return 0;
}

struct report {
  tagmem_status status = TAGMEM_SUCCESS;
  std::uint64_t moved = 0;
  std::uint64_t host = 0;
  std::uint64_t mapped = 0;
  std::string bytes;
};
report parse(const std::string& text) {
  std::istringstream in(text);
  int st = 0;
  report r;
  in >> st >> r.moved >> r.host >> r.mapped >> r.bytes;
  r.status = static_cast<tagmem_status>(st);
  return r;
}

class Replica : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(reliability::emu().available);
    before_ = take_fd_census();
    seed_ = std::random_device{}();
    group_ = "g" + std::to_string(++groups_);
  }
  void TearDown() override {
    unsetenv("TAGMEM_EMU_KILL_AT");
    unsetenv("TAGMEM_REPLICA_TIMEOUT_MS");
    for (auto& p : peers_) {
      if (p) p->kill_now();
    }
    peers_.clear();
    tagmem_shutdown();
    EXPECT_EQ(reliability::emu().device_used_bytes(0), 0u) << "memory of the dead is still used";
    EXPECT_EQ(emu_leaks(), "");
    EXPECT_EQ(take_fd_census(), before_)
        << describe(take_fd_census()) << " / " << describe(before_);
  }
  // This process as rank self_rank_ and `size - 1` peers as the other ranks, in order, all
  // resident; the first peer (rank 1, or rank 0 when this process is rank 1) is started with
  // `kill_at` and, when given, its own seed or allocation count.
  void start(int size, const char* kill_at = nullptr, std::uint64_t peer_seed = 0,
             int peer_count = kCount) {
    check(tagmem_init(nullptr), "tagmem_init");
    std::mt19937_64 rng(seed_);
    mine_ = fill_tag(kTag, kCount, kBytes, rng);
    check(tagmem_set_replicated(kTag, 0, group_.c_str(), self_rank_, size),
          "tagmem_set_replicated");
    for (int r = 0; r < size; ++r) {
      if (r == self_rank_) continue;
      const bool first = peers_.empty();
      if (kill_at && first) setenv("TAGMEM_EMU_KILL_AT", kill_at, 1);
      peers_.push_back(std::make_unique<peer_process>("replica", "r"));
      unsetenv("TAGMEM_EMU_KILL_AT");
      const std::uint64_t seed = first && peer_seed ? peer_seed : seed_;
      peers_.back()->channel().send(std::to_string(seed) + " " + std::to_string(r) + " " +
                                    std::to_string(size) + " " +
                                    std::to_string(first ? peer_count : kCount) + " " + group_);
      peers_.back()->channel().expect("resident");
    }
  }
  // Every replica offloads at once; returns this process's status.
  tagmem_status offload_all() {
    for (auto& p : peers_) p->channel().send("offload");
    const char* tag = kTag;
    return tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP);
  }
  peer_process& peer(int rank) { return *peers_[rank < self_rank_ ? rank : rank - 1]; }
  report answer(int rank) { return parse(peer(rank).channel().receive()); }
  void expect_reload_intact() {
    const char* tag = kTag;
    check(tagmem_reload(&tag, 1, 0), "reload");
    EXPECT_EQ(corrupted(mine_), 0u);
    EXPECT_EQ(stats_of(kTag).host_bytes, 0u);
  }
  // Every replica's offload is refused, saying `why`; this one's tag is resident and intact.
  void expect_refused(const char* why) {
    EXPECT_EQ(offload_all(), TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tagmem_last_error()).find(why), std::string::npos) << tagmem_last_error();
    EXPECT_EQ(answer(1).status, TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stats_of(kTag).state, TAGMEM_RESIDENT);
    EXPECT_EQ(corrupted(mine_), 0u);
  }
  std::size_t run() const { return 20 * MiB; }  // the one segment the tag maps
  // One offload at once and the reloads, so that every replica keeps the shared copy.
  void cycle_at_once() {
    check(offload_all(), "offload");
    for (int r = 1; r < static_cast<int>(peers_.size()) + 1; ++r) {
      ASSERT_EQ(answer(r).status, TAGMEM_SUCCESS) << "rank " << r;
    }
    for (auto& p : peers_) p->channel().send("reload");
    expect_reload_intact();
    for (int r = 1; r < static_cast<int>(peers_.size()) + 1; ++r) {
      ASSERT_EQ(answer(r).bytes, "intact") << "rank " << r;
    }
  }
  // New bytes from `seed` in every replica.
  void refill_all(std::uint64_t seed) {
    for (auto& p : peers_) p->channel().send("refill " + std::to_string(seed));
    refill(mine_, seed);
    for (auto& p : peers_) p->channel().expect("refilled");
  }
  // Waits (10 s at most) until this replica's offloaded tag maps nothing: its waiter is done.
  bool settles() {
    for (int i = 0; i < 1000; ++i) {
      if (stats_of(kTag).mapped_bytes == 0) return true;
      usleep(10 * 1000);
    }
    return false;
  }

  static inline int groups_ = 0;
  int self_rank_ = 0;
  fd_census before_;
  std::uint64_t seed_ = 0;
  std::string group_;
  tag_data mine_;
  std::vector<std::unique_ptr<peer_process>> peers_;
};

class ReplicaGroup : public Replica, public ::testing::WithParamInterface<int> {};

TEST_P(ReplicaGroup, EachMovesItsShareAndAllReloadEveryByte) {
  const int n = GetParam();
  start(n);
  check(offload_all(), "offload");
  std::uint64_t moved = stats_of(kTag).bytes_offloaded;
  EXPECT_LE(moved, run() / n + n * 64 * 1024) << "rank 0 copied more than its share";
  EXPECT_EQ(stats_of(kTag).host_bytes, run() + kHeader);  // the one copy, with its header
  for (int r = 1; r < n; ++r) {
    const report a = answer(r);
    ASSERT_EQ(a.status, TAGMEM_SUCCESS) << "rank " << r;
    EXPECT_LE(a.moved, run() / n + n * 64 * 1024) << "rank " << r << " copied more than its share";
    EXPECT_EQ(a.host, run() + kHeader);
    moved += a.moved;
  }
  EXPECT_EQ(moved, run()) << "the shares do not add up to the tag";
  for (auto& p : peers_) p->channel().send("reload");
  expect_reload_intact();
  for (int r = 1; r < n; ++r) EXPECT_EQ(answer(r).bytes, "intact") << "rank " << r;
  for (auto& p : peers_) p->channel().send("exit");
  for (auto& p : peers_) EXPECT_EQ(p->wait(), 0);
  peers_.clear();
}

INSTANTIATE_TEST_SUITE_P(Sizes, ReplicaGroup, ::testing::Values(2, 3));

TEST_F(Replica, DifferentBytesAreRefusedOnEveryReplica) {
  start(2, nullptr, seed_ + 1);
  expect_refused("different bytes");
}

TEST_F(Replica, DifferentLayoutsAreRefusedOnEveryReplica) {
  start(2, nullptr, 0, kCount - 1);
  expect_refused("replicas differ");
}

// A replica that never offloads: the others' offload fails naming it, their tags resident, and
// a retry with every replica present succeeds.
TEST_F(Replica, AMissingReplicaIsNamedAndTheOffloadRetryable) {
  start(2);
  setenv("TAGMEM_REPLICA_TIMEOUT_MS", "300", 1);
  const char* tag = kTag;
  EXPECT_NE(tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  const std::string why = tagmem_last_error();
  EXPECT_NE(why.find("1 did not join"), std::string::npos) << why;
  EXPECT_NE(why.find("replicated tag 'w'"), std::string::npos) << why;
  EXPECT_EQ(stats_of(kTag).state, TAGMEM_RESIDENT);
  unsetenv("TAGMEM_REPLICA_TIMEOUT_MS");
  check(offload_all(), "offload again");
  EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
  expect_reload_intact();
}

// Killed while the sample is read or before its share is written: the survivor writes the
// share itself.
TEST_F(Replica, KilledBeforeItsShare) {
  start(2, "cuMemcpyDtoHAsync:1");  // the share's first copy (the samples are read in sync)
  check(offload_all(), "offload");
  EXPECT_EQ(stats_of(kTag).bytes_offloaded, run()) << "the survivor did not write the dead share";
  EXPECT_EQ(peers_[0]->wait(), 128 + SIGKILL) << "the victim was not killed there";
  peers_.clear();
  expect_reload_intact();
}

// Three replicas; rank 0, which made the shared copy and sent it to the others, killed before its
// share: both survivors still hold the copy and write that share.
TEST_F(Replica, ThreeReplicasTheCopysMakerKilledBeforeItsShare) {
  self_rank_ = 1;
  start(3, "cuMemcpyDtoHAsync:1");
  check(offload_all(), "offload");
  EXPECT_EQ(answer(2).status, TAGMEM_SUCCESS);
  EXPECT_EQ(peer(0).wait(), 128 + SIGKILL) << "rank 0 was not killed there";
  peer(2).channel().send("reload");
  expect_reload_intact();
  EXPECT_EQ(answer(2).bytes, "intact");
}

// Killed after writing its share, while unmapping its tag.
TEST_F(Replica, KilledAfterItsShare) {
  start(2, "cuMemUnmap:1");
  check(offload_all(), "offload");
  EXPECT_LE(stats_of(kTag).bytes_offloaded, run() / 2 + 64 * 1024);
  EXPECT_EQ(peers_[0]->wait(), 128 + SIGKILL) << "the victim was not killed there";
  peers_.clear();
  expect_reload_intact();
}

// The second offload uses the copy the first one's reload kept (the fds and mappings do not grow)
// with new bytes in every replica; tagmem_host_trim gives it back.
TEST_F(Replica, TheCopyIsKeptForTheNextOffloadAndTrimmed) {
  start(2);
  int kept = 0;
  for (int cycle = 1; cycle <= 2; ++cycle) {
    if (cycle == 2) {
      const std::uint64_t seed = seed_ + 7;
      peers_[0]->channel().send("refill " + std::to_string(seed));
      refill(mine_, seed);
      peers_[0]->channel().expect("refilled");
    }
    check(offload_all(), "offload");
    EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
    void* view = nullptr;
    std::size_t viewed = 0;
    EXPECT_EQ(tagmem_host_view(mine_.ptrs[0], 0, &view, &viewed), TAGMEM_ERROR_TAG_OFFLOADED)
        << "host views do not read the shared copy";
    peers_[0]->channel().send("reload");
    expect_reload_intact();
    EXPECT_EQ(answer(1).bytes, "intact");
    const int copies = take_fd_census().shared_copies;  // its descriptors and mapping
    EXPECT_GT(copies, before_.shared_copies) << "no shared copy is held after cycle " << cycle;
    if (cycle == 1) kept = copies;
    EXPECT_EQ(copies, kept) << "cycle 2 holds another copy than cycle 1";
  }
  EXPECT_EQ(stats_of(kTag).bytes_offloaded, 2 * (run() / 2)) << "not one share each cycle";
  check(tagmem_host_trim(0), "tagmem_host_trim");
  EXPECT_EQ(take_fd_census().shared_copies, before_.shared_copies);
}

// Killed before its share in the second offload, through the copy the first one kept (each
// offloads alone, Note [offload alone]): the survivor's mapping waits for that share until it
// sees the replica gone, then copies the share itself and unmaps.
TEST_F(Replica, KilledBeforeItsShareOnAKeptCopy) {
  start(2, "cuMemcpyDtoHAsync:2");  // cycle 1: its share (one piece); cycle 2: this one
  check(offload_all(), "offload");
  EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
  peers_[0]->channel().send("reload");
  expect_reload_intact();
  EXPECT_EQ(answer(1).bytes, "intact");
  const std::uint64_t seed = seed_ + 9;  // new bytes: a stale share would not match them
  peers_[0]->channel().send("refill " + std::to_string(seed));
  refill(mine_, seed);
  peers_[0]->channel().expect("refilled");
  const std::uint64_t moved = stats_of(kTag).bytes_offloaded;
  check(offload_all(), "offload on the kept copy");
  EXPECT_EQ(peers_[0]->wait(), 128 + SIGKILL) << "the victim was not killed there";
  peers_.clear();
  EXPECT_TRUE(settles()) << "the dead share was not written, or the mapping not unmapped";
  EXPECT_EQ(stats_of(kTag).bytes_offloaded - moved, run()) << "the dead share was not written";
  expect_reload_intact();
}

// The controller asks one replica after the other (Note [offload alone]): the first offload
// through the kept copy returns after its own share, its mapping waiting for the other's; the
// second writes only its share and unmaps everything; the first's waiter then unmaps its own.
TEST_F(Replica, OneAfterTheOther) {
  start(2);
  cycle_at_once();
  const std::uint64_t seed = seed_ + 11;
  refill_all(seed);
  const std::uint64_t moved = stats_of(kTag).bytes_offloaded;
  const char* tag = kTag;
  check(tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP), "offload alone");
  tagmem_tag_stats s = stats_of(kTag);
  EXPECT_EQ(s.state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(s.bytes_offloaded - moved, run() / 2) << "rank 0 did not copy only its share";
  EXPECT_EQ(s.mapped_bytes, run()) << "the one mapping holds rank 1's share: it waits";
  EXPECT_EQ(s.host_bytes, run() + kHeader);
  // Still mapped for rank 1's share, the tag is offloaded through the shared copy all the same:
  // a host view is refused as such, not as a resident tag's.
  void* view = nullptr;
  std::size_t viewed = 0;
  EXPECT_EQ(tagmem_host_view(mine_.ptrs[0], 0, &view, &viewed), TAGMEM_ERROR_TAG_OFFLOADED)
      << tagmem_last_error();
  peer(1).channel().send("offload");
  const report a = answer(1);
  ASSERT_EQ(a.status, TAGMEM_SUCCESS);
  EXPECT_EQ(a.mapped, 0u) << "rank 1 found both shares written and unmapped all";
  EXPECT_TRUE(settles()) << "rank 0's mapping was not unmapped once rank 1's share was written";
  EXPECT_EQ(stats_of(kTag).bytes_offloaded - moved, run() / 2) << "rank 0 copied rank 1's share";
  peer(1).channel().send("reload");
  expect_reload_intact();
  EXPECT_EQ(answer(1).bytes, "intact");
}

// Three replicas one after the other: each but the last keeps mapped what lies in shares not yet
// written; the last finds every other share written and unmaps all; every replica reloads every
// byte.
TEST_F(Replica, OneAfterTheOtherThreeReplicas) {
  start(3);
  cycle_at_once();
  refill_all(seed_ + 19);
  const std::uint64_t moved = stats_of(kTag).bytes_offloaded;
  const char* tag = kTag;
  check(tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP), "offload alone");
  EXPECT_EQ(stats_of(kTag).mapped_bytes, run()) << "the one mapping waits for ranks 1 and 2";
  peer(1).channel().send("offload");
  const report one = answer(1);
  ASSERT_EQ(one.status, TAGMEM_SUCCESS);
  EXPECT_EQ(one.mapped, run()) << "rank 1's mapping waits for rank 2's share";
  peer(2).channel().send("offload");
  const report two = answer(2);
  ASSERT_EQ(two.status, TAGMEM_SUCCESS);
  EXPECT_EQ(two.mapped, 0u) << "rank 2 found every other share written";
  EXPECT_TRUE(settles());
  // Each copied its own share, in this offload as in the one at once before it.
  const std::size_t step = run() / 3 / (64 * 1024) * (64 * 1024);  // shares 0 and 1
  EXPECT_EQ(stats_of(kTag).bytes_offloaded - moved, step);
  EXPECT_EQ(one.moved, 2 * step);
  EXPECT_EQ(two.moved, 2 * (run() - 2 * step));
  for (int r = 1; r <= 2; ++r) peer(r).channel().send("reload");
  expect_reload_intact();
  for (int r = 1; r <= 2; ++r) EXPECT_EQ(answer(r).bytes, "intact") << "rank " << r;
}

// One after the other, the second never comes: after TAGMEM_REPLICA_TIMEOUT_MS the first copies
// the missing share itself; the late replica then finds its share written and only unmaps.
TEST_F(Replica, OneAfterTheOtherTheSecondLate) {
  start(2);
  cycle_at_once();
  refill_all(seed_ + 13);
  setenv("TAGMEM_REPLICA_TIMEOUT_MS", "200", 1);
  const std::uint64_t moved = stats_of(kTag).bytes_offloaded;
  const char* tag = kTag;
  check(tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP), "offload alone");
  EXPECT_TRUE(settles()) << "the late share was not copied after the bound";
  EXPECT_EQ(stats_of(kTag).bytes_offloaded - moved, run());
  peer(1).channel().send("offload");
  const report a = answer(1);
  ASSERT_EQ(a.status, TAGMEM_SUCCESS);
  EXPECT_EQ(a.mapped, 0u);
  peer(1).channel().send("reload");
  EXPECT_EQ(answer(1).bytes, "intact");
  expect_reload_intact();
}

// Offloading again while another replica has not reloaded the last offload would overwrite the
// shares it needs: PEER naming it, the tag resident and intact; once it has reloaded, it works.
TEST_F(Replica, AReplicaNotReloadedIsNamed) {
  start(2);
  cycle_at_once();
  check(offload_all(), "offload");
  EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
  expect_reload_intact();
  const char* tag = kTag;
  EXPECT_EQ(tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_PEER);
  const std::string why = tagmem_last_error();
  EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
  EXPECT_NE(why.find("has not reloaded"), std::string::npos) << why;
  EXPECT_EQ(stats_of(kTag).state, TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(mine_), 0u);
  peer(1).channel().send("reload");
  EXPECT_EQ(answer(1).bytes, "intact");
  check(offload_all(), "offload once every replica reloaded");
  EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
  peer(1).channel().send("reload");
  expect_reload_intact();
  EXPECT_EQ(answer(1).bytes, "intact");
}

// Alone, the second replica holds other bytes than the first offloaded, which still needs them:
// INVALID_ARGUMENT naming it, the second resident; the first copies the missing share itself.
TEST_F(Replica, OneAfterTheOtherDifferentBytesAreRefused) {
  start(2);
  cycle_at_once();
  setenv("TAGMEM_REPLICA_TIMEOUT_MS", "300", 1);
  refill(mine_, seed_ + 17);  // only here: rank 1 keeps its bytes
  const char* tag = kTag;
  check(tagmem_offload(&tag, 1, 0, TAGMEM_BACKUP), "offload alone");
  peer(1).channel().send("offload");
  const report a = answer(1);
  EXPECT_EQ(a.status, TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(a.mapped, run()) << "the refused replica is not resident";
  EXPECT_TRUE(settles());
  expect_reload_intact();
  peer(1).channel().send("reload");
  EXPECT_EQ(parse(peer(1).channel().receive()).status, TAGMEM_ERROR_TAG_RESIDENT);
}

// Killed once the offload is over (before its reload): the survivor's copy is whole.
TEST_F(Replica, KilledAfterTheOffload) {
  start(2);
  check(offload_all(), "offload");
  EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
  peers_[0]->kill_now();
  peers_.clear();
  expect_reload_intact();
}

// Killed in the middle of its own reload.
TEST_F(Replica, KilledDuringItsReload) {
  start(2, "cuMemcpyHtoDAsync:1");  // the reload's first copy from the shared copy
  check(offload_all(), "offload");
  EXPECT_EQ(answer(1).status, TAGMEM_SUCCESS);
  peers_[0]->channel().send("reload");
  EXPECT_EQ(peers_[0]->wait(), 128 + SIGKILL) << "the victim was not killed there";
  peers_.clear();
  expect_reload_intact();
}

}  // namespace
}  // namespace tagmem::handoff_test
