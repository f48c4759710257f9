// shared_buffers_test.cpp — two processes sharing NCCL-style buffers pause and
// resume the `nccl` tag together (the scenario is in shared_buffers.cpp).
#include "shared_buffers.hpp"

#include <gtest/gtest.h>

#include "peer.hpp"

namespace tagmem::preload_test {
namespace {

TAGMEM_PEER_SCENARIO(shared_buffers_rank1) {
  std::vector<std::string> failures = run_shared_buffers(1, args.channel, args.group, {});
  for (const auto& f : failures) std::fprintf(stderr, "[peer] %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

TEST(SharedBuffers, CollectivePauseReleasesAndResumeRestoresEveryByteAndMapping) {
  std::string group = unique_group("shared");
  peer_process peer("shared_buffers_rank1", group);
  std::vector<std::string> failures = run_shared_buffers(0, peer.channel(), group, {});
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(peer.wait(), 0) << "rank 1's checks failed (its messages are on stderr)";
}

}  // namespace
}  // namespace tagmem::preload_test
