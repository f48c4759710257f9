// pair_test.cpp — the data path between two processes over a connected socket: what one process's
// offload unmaps, the other's reload maps, with no cuMemCreate, every byte of the BACKUP tags
// intact, and nothing left behind in either process.
//
// The channel is a socket pair handed to both sides' handoff with attach_handoff_for_test (no
// greeting); the giver looks for takers in a directory of its own, so this channel is its only
// session. Meeting through the job's directory is tested in meet_test.cpp.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <random>

#include "api/runtime.hpp"
#include "harness.hpp"
#include "peer.hpp"
#include "registry/registry.hpp"

namespace tagmem::handoff_test {
namespace {

// kPiece: one mapping each; two side by side make one 60 MiB reload run.

void attach(int fd, bool giver) {
  runtime::hold h;
  h.core().attach_handoff_for_test(0, fd, giver);
}

// The giver: a DISCARD tag of two mappings, offloaded over the channel it receives, then its own
// BACKUP tag through a full cycle, and nothing left behind.
TAGMEM_PEER_SCENARIO(pair_giver) {
  const fd_census before = take_fd_census();
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data kv = fill_tag("kv", 2, kPiece, rng);
  tag_data own = fill_tag("own", 3, 8 * MiB, rng);
  std::vector<int> fds;
  args.channel.receive(&fds);
  if (fds.size() != 1) return 10;
  attach(fds[0], true);
  const char* kv_tag = "kv";
  check(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), "offload kv");
  const tagmem_handoff_stats s = handoff_stats();
  const char* own_tag = "own";
  check(tagmem_offload(&own_tag, 1, 0, TAGMEM_BACKUP), "offload own");
  check(tagmem_reload(&own_tag, 1, 0), "reload own");
  if (corrupted(own) != 0) return 11;
  check(tagmem_shutdown(), "tagmem_shutdown");
  const std::string leaks = emu_leaks();
  const fd_census after = take_fd_census();
  args.channel.send("given " + std::to_string(s.given_bytes) + " " +
                    std::to_string(s.given_handles) + " leaks '" + leaks + "' fds " +
                    describe(after) + " / " + describe(before));
  return leaks.empty() && after == before ? 0 : 12;
}

TEST(HandoffPair, DiscardOffloadFeedsReloadWithoutCreate) {
  std::mt19937_64 rng(std::random_device{}());
  const std::uint64_t seed = rng();
  const fd_census before = take_fd_census();
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  tag_data w = fill_tag("w", 2, kPiece, rng);
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(handoff_stats().listening, 1);  // it has offloaded tags (after_offload)

  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  attach(sv[0], false);
  // The giver finds no taker in its own directory: the channel is its only session.
  const std::string dir = std::getenv("TAGMEM_PEER_DIR");
  setenv("TAGMEM_PEER_DIR", make_private_dir("giver").c_str(), 1);
  auto giver = std::make_unique<peer_process>("pair_giver", "g");
  setenv("TAGMEM_PEER_DIR", dir.c_str(), 1);
  giver->channel().send(std::to_string(seed));
  giver->channel().send("channel", {sv[1]});
  ::close(sv[1]);
  const std::string report = giver->channel().receive();
  EXPECT_EQ(giver->wait(), 0) << report;
  giver.reset();  // its control channel closes
  EXPECT_EQ(report.rfind("given " + std::to_string(2 * kPiece) + " 2 leaks '' fds", 0), 0u)
      << report;

  tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.received_bytes, 2 * kPiece);
  EXPECT_EQ(s.received_handles, 2u);
  EXPECT_EQ(s.held_bytes, 2 * kPiece);
  const std::uint64_t creates = emu_calls("cuMemCreate");
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(emu_calls("cuMemCreate"), creates) << "the reload created memory";
  EXPECT_EQ(corrupted(w), 0u);
  s = handoff_stats();
  EXPECT_EQ(s.mapped_received_bytes, 2 * kPiece);
  EXPECT_EQ(s.held_bytes, 0u);
  EXPECT_EQ(s.listening, 0);  // nothing offloaded any more
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(emu_leaks(), "");
  EXPECT_EQ(take_fd_census(), before) << describe(take_fd_census()) << " / " << describe(before);
}

}  // namespace
}  // namespace tagmem::handoff_test
