// inconsistent_peer_test.cpp — NCCL pauses and resumes with a rank that lies.
//
// This process (rank 0, under the shim) owns NCCL-style buffers of random bytes, one of them
// exported; rank 1 is tagmem_inconsistent_peer (inconsistent_peer.cpp), which takes every step of
// each call but says, at random, what no honest rank would. Round after round this process pauses
// (or, when paused, resumes) with it. Whatever a call concludes, it returns (no hang beyond the
// timeout, no crash, no sanitizer report), a failure carries a message, and whenever the tag is
// resident every buffer holds its bytes; once the peer is honest again, a resume succeeds, every
// byte is back and no descriptor is left over. TAGMEM_PEER_FUZZ_SEED (else a fresh seed) and
// TAGMEM_PEER_FUZZ_ROUNDS (default 12) repeat or lengthen a run; tests/sanitizers.sh runs more.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include "nccl_way.hpp"
#include "peer.hpp"

namespace tagmem::preload_test {
namespace {

constexpr int kTimeoutMs = 5000;

std::uint64_t env_number(const char* name, std::uint64_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : otherwise;
}

TEST(InconsistentPeer, LiesAtAnyStepLoseNoByteAndLeakNoDescriptor) {
  const std::uint64_t seed = env_number("TAGMEM_PEER_FUZZ_SEED", std::random_device()());
  const std::uint64_t rounds = env_number("TAGMEM_PEER_FUZZ_ROUNDS", 12);
  SCOPED_TRACE("TAGMEM_PEER_FUZZ_SEED=" + std::to_string(seed));
  use_device(0);
  const std::string group = unique_group("liar");
  filled mine(0, seed, 2u << 20, 3);
  ::close(export_fd(mine.buffers[0]));  // the shim keeps its own duplicate, as for NCCL
  auto liar = peer_process::program("tagmem_inconsistent_peer",
                                    {group, "1", "2", std::to_string(kTimeoutMs)});
  const long descriptors = open_descriptors();
  std::mt19937_64 rng(seed);
  std::map<std::string, int> tally;  // "pause SUCCESS" -> count, printed for whoever reads the log

  // One call with the peer at `peer_seed` (0: honest); returns its status.
  auto call = [&](std::uint64_t peer_seed, std::uint64_t round) {
    const bool paused = shim_stats().paused != 0;
    const std::string op = paused ? "resume" : "pause";
    SCOPED_TRACE(op + " of round " + std::to_string(round) + ", peer seed " +
                 std::to_string(peer_seed));
    liar->channel().send(op + " " + std::to_string(peer_seed));
    const tagmem_status s = paused ? shim().resume(group.c_str(), 0, 2, kTimeoutMs)
                                   : shim().pause(group.c_str(), 0, 2, kTimeoutMs);
    if (s != TAGMEM_SUCCESS) {
      EXPECT_STRNE(shim().last_error(), "") << "a failure says why";
    }
    tally[op + " " + shim().status_string(s)]++;
    const std::string reply = liar->channel().receive(nullptr, 4 * kTimeoutMs);
    EXPECT_EQ(reply.rfind("done", 0), 0u) << reply;
    if (shim_stats().paused == 0) {
      EXPECT_TRUE(mine.intact()) << "resident, but bytes differ";
    }
    return s;
  };

  for (std::uint64_t round = 0; round < rounds && !HasFailure(); ++round) call(rng() | 1, round);
  for (int tries = 0; tries < 3 && shim_stats().paused != 0; ++tries) call(0, rounds + tries);
  EXPECT_EQ(shim_stats().paused, 0u) << "an honest peer could not resume: " << shim().last_error();
  EXPECT_TRUE(mine.intact());
  liar->channel().send("quit");
  EXPECT_EQ(liar->wait(), 0);
  EXPECT_LE(open_descriptors(), descriptors) << "a descriptor is left over";
  for (const auto& [what, count] : tally)
    std::printf("[inconsistent peer] %s: %d\n", what.c_str(), count);
}

}  // namespace
}  // namespace tagmem::preload_test
