// trace_test.cpp — what a hand-over leaves in the two processes' traces (TAGMEM_TRACE,
// docs/observe.md): the giver's `give` and `given` spans, the taker's `take` spans, each with the
// bytes of one handle, and the taker's `copy_mark` counter around its reload's copies.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "harness.hpp"
#include "test_support.hpp"

namespace tagmem::handoff_test {
namespace {

using test::scoped_env;

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The bytes of every span `name` in `text`, in order.
std::vector<std::uint64_t> span_bytes(const std::string& text, const std::string& name) {
  const std::regex span(R"re(\{"name":")re" + name +
                        R"re(","cat":"tagmem","ph":"X",[^{]*"args":\{"bytes":([0-9]+)\})re");
  std::vector<std::uint64_t> out;
  for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) {
    out.push_back(std::stoull((*it)[1]));
  }
  return out;
}

// The values the counter `name` took in `text`, in order.
std::vector<std::uint64_t> counter_values(const std::string& text, const std::string& name) {
  const std::regex counter(R"re(\{"name":")re" + name +
                           R"re(","ph":"C",[^{]*"args":\{"bytes":([0-9]+)\})re");
  std::vector<std::uint64_t> out;
  for (std::sregex_iterator it(text.begin(), text.end(), counter), end; it != end; ++it) {
    out.push_back(std::stoull((*it)[1]));
  }
  return out;
}

std::uint64_t sum(const std::vector<std::uint64_t>& v) {
  std::uint64_t s = 0;
  for (std::uint64_t x : v) s += x;
  return s;
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

  const std::string taker = read_all(mine), giver = read_all(theirs);
  const std::vector<std::uint64_t> taken = span_bytes(taker, "take");
  EXPECT_FALSE(taken.empty()) << mine;
  EXPECT_EQ(sum(taken), 2 * kPiece) << "the taker's take spans";
  EXPECT_EQ(sum(span_bytes(giver, "give")), 2 * kPiece) << "the giver's give spans";
  EXPECT_EQ(sum(span_bytes(giver, "given")), 2 * kPiece) << "the giver's given spans";
  EXPECT_TRUE(span_bytes(taker, "give").empty()) << "the taker gave nothing";
  // The reload marked once and let the mark go when its copies ended.
  EXPECT_EQ(counter_values(taker, "copy_mark"), (std::vector<std::uint64_t>{1, 0}));
  std::remove(mine.c_str());
  std::remove(theirs.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace tagmem::handoff_test
