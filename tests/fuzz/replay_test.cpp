// replay_test.cpp — runs every saved fuzzer input (the seed corpus and past findings) as a test.
//
// tests/fuzz/corpus/ holds the seeds the fuzzer starts from; tests/fuzz/regressions/ holds
// inputs that once broke an expectation (each named after what it found). Every one must run
// clean against the model, in any build: this test needs no libFuzzer and runs in CI under the
// plain, ASan/UBSan builds alike. TAGMEM_FUZZ_ONLY=<substring> replays only the matching files
// (to reproduce one finding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "state_machine.hpp"

namespace tagmem::fuzz {
namespace {

std::vector<std::filesystem::path> inputs(const char* dir) {
  std::vector<std::filesystem::path> out;
  std::filesystem::path root = std::filesystem::path(TAGMEM_FUZZ_DIR) / dir;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const char* only = std::getenv("TAGMEM_FUZZ_ONLY");
    if (only && e.path().filename().string().find(only) == std::string::npos) continue;
    if (e.is_regular_file() && e.path().extension() != ".md") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void replay(const char* dir, std::size_t at_least) {
  std::string why;
  ASSERT_TRUE(prepare(&why)) << why;
  auto files = inputs(dir);
  if (std::getenv("TAGMEM_FUZZ_ONLY")) at_least = 0;
  ASSERT_GE(files.size(), at_least) << "inputs missing from tests/fuzz/" << dir;
  const std::uint64_t ops_before = process_totals().operations;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    program_result r = run_program(bytes.data(), bytes.size());
    EXPECT_TRUE(r.ok) << f.filename() << ":\n" << r.failure;
  }
  if (!files.empty()) {
    EXPECT_GT(process_totals().operations, ops_before);
  }
}

TEST(FuzzReplay, SeedCorpusRunsClean) {
  replay("corpus", 8);
  if (std::getenv("TAGMEM_FUZZ_ONLY")) return;
  // The seeds reach the paths of hostile and unlucky conditions: a free at a thread's exit, as
  // its first call and after it used tagmem, and every state of the release clock's page.
  const totals& t = process_totals();
  EXPECT_GT(t.frees_at_thread_exit[0], 0u);
  EXPECT_GT(t.frees_at_thread_exit[1], 0u);
  for (int state = 0; state < 4; ++state) EXPECT_GT(t.clock_page_states[state], 0u) << state;
}

TEST(FuzzReplay, PastFindingsStayFixed) { replay("regressions", 0); }

}  // namespace
}  // namespace tagmem::fuzz
