// rendezvous_replay_test.cpp — the rendezvous fuzzer's target in every build (label emu): each
// input of tests/fuzz/rendezvous_corpus, then a fixed number of deterministic mutations of them
// (bytes flipped, cut, lengthened, counts set to extremes). A finding aborts the process, which
// fails the test; tests/fuzz/rendezvous_fuzz.cpp says what counts as one.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(TAGMEM_RENDEZVOUS_CORPUS)) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string(TAGMEM_RENDEZVOUS_CORPUS) + "/" + e->d_name, std::ios::binary);
      std::stringstream s;
      s << f.rdbuf();
      out.push_back(s.str());
    }
    ::closedir(d);
  }
  return out;
}

void run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
}

TEST(RendezvousFuzzReplay, CorpusAndMutations) {
  std::vector<std::string> seeds = corpus();
  ASSERT_GE(seeds.size(), 18u) << "the committed corpus has an input for every decoder";
  for (const std::string& s : seeds) run(s);
  std::mt19937_64 rng(20261201);
  const std::uint32_t extremes[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 64u << 20};
  for (int i = 0; i < 200000; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    switch (rng() % 4) {
      case 0:  // flip bytes
        for (int k = 0; k < 3 && s.size() > 1; ++k) s[1 + rng() % (s.size() - 1)] ^= rng();
        break;
      case 1:  // cut
        s.resize(rng() % (s.size() + 1));
        break;
      case 2:  // lengthen
        s.append(rng() % 16, static_cast<char>(rng()));
        break;
      case 3:  // an extreme 32-bit value somewhere
        if (s.size() >= 5) {
          std::uint32_t v = extremes[rng() % 6];
          std::size_t at = 1 + rng() % (s.size() - 4);
          std::memcpy(&s[at], &v, sizeof v);
        }
        break;
    }
    run(s);
  }
}

}  // namespace
