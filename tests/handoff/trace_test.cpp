// trace_test.cpp — what a hand-over leaves in the two processes' traces (TAGMEM_TRACE,
// docs/observe.md): the giver's `give` and `given` spans, the taker's `take` spans, each with the
// bytes of one handle, and the taker's `copy_mark` counter around its reload's copies.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "test_support.hpp"
#include "trace_events.hpp"

namespace tagmem::handoff_test {
namespace {

using test::event_bytes;
using test::scoped_env;
using test::trace_text;

// The sum of `v`.
std::uint64_t sum(const std::vector<std::uint64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::uint64_t{0});
}

class HandoffTrace : public shared_device_test {};

TEST_F(HandoffTrace, GiverAndTakerTraceEachHandleAndTheTakerItsCopyMark) {
  std::mt19937_64 rng(seed_);
  const std::string dir = ::testing::TempDir() + "tagmem_hoff_trace_" + std::to_string(rng());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
  {
    // "%p": the giver, started below, inherits the setting and writes its own file.
    scoped_env trace("TAGMEM_TRACE", (dir + "/t-%p.json").c_str());
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    tag_data w = fill_tag("w", 2, kPiece, rng);
    const char* w_tag = "w";
    ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
    discard_giver_hands_over(seed_ + 1);  // hands this process 2 * kPiece
    ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(corrupted(w), 0u);
    for (void* p : w.ptrs) ASSERT_EQ(tagmem_free(p, nullptr), TAGMEM_SUCCESS);
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();  // writes the trace
  }
  const std::string mine = dir + "/t-" + std::to_string(::getpid()) + ".json";
  std::string theirs;
  DIR* d = ::opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("t-", 0) == 0 && dir + "/" + name != mine) theirs = dir + "/" + name;
  }
  ::closedir(d);
  ASSERT_FALSE(theirs.empty()) << "the giver wrote no trace in " << dir;

  const std::string taker = trace_text(mine), giver = trace_text(theirs);
  const std::vector<std::uint64_t> taken = event_bytes(taker, "take", false);
  EXPECT_FALSE(taken.empty()) << mine;
  EXPECT_EQ(sum(taken), 2 * kPiece) << "the taker's take spans";
  EXPECT_EQ(sum(event_bytes(giver, "give", false)), 2 * kPiece) << "the giver's give spans";
  EXPECT_EQ(sum(event_bytes(giver, "given", false)), 2 * kPiece) << "the giver's given spans";
  EXPECT_TRUE(event_bytes(taker, "give", false).empty()) << "the taker gave nothing";
  // The reload marked once and let the mark go when its copies ended.
  EXPECT_EQ(event_bytes(taker, "copy_mark", true), (std::vector<std::uint64_t>{1, 0}));
  std::remove(mine.c_str());
  std::remove(theirs.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace tagmem::handoff_test
