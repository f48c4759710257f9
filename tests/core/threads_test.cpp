// threads_test.cpp — concurrent allocation, free and offload on distinct tags keeps every byte.
#include <atomic>
#include <thread>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class Threads : public tagmem_test {};

TEST_F(Threads, EightThreadsAllocateFreeAndOffloadDistinctTagsWithoutCorruption) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 12;
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> verified{0};
  auto worker = [&](int id) {
    auto rng = rng_for_test();
    rng.discard(id * 1000);
    std::string tag = "thread" + std::to_string(id);
    TAGMEM_OK(tagmem_push_tag(tag.c_str()));
    std::vector<std::pair<void*, std::vector<unsigned char>>> live;
    const char* tags[] = {tag.c_str()};
    for (int round = 0; round < kRounds; ++round) {
      for (int i = 0; i < 40; ++i) {
        std::size_t size = 1 + rng() % (i % 8 == 0 ? (3u << 20) : 20000u);
        void* p = nullptr;
        if (tagmem_malloc(&p, size, 0, nullptr) != TAGMEM_SUCCESS) {
          ADD_FAILURE() << tagmem_last_error();
          failures++;
          return;
        }
        live.emplace_back(p, random_bytes(rng, size));
        write_device(p, live.back().second.data(), size);
      }
      // Free a random third.
      for (std::size_t i = 0; i < live.size();) {
        if (rng() % 3 == 0) {
          if (tagmem_free(live[i].first, nullptr) != TAGMEM_SUCCESS) failures++;
          live[i] = std::move(live.back());
          live.pop_back();
        } else {
          ++i;
        }
      }
      tagmem_offload_mode mode = TAGMEM_BACKUP;
      if (tagmem_offload(tags, 1, 0, mode) != TAGMEM_SUCCESS ||
          tagmem_reload(tags, 1, 0) != TAGMEM_SUCCESS) {
        ADD_FAILURE() << tag << ": " << tagmem_last_error();
        failures++;
        return;
      }
      for (auto& [p, bytes] : live) {
        if (read_device(p, bytes.size()) != bytes) failures++;
        verified += bytes.size();
      }
      if (round % 4 == 3 && tagmem_empty_cache(0) != TAGMEM_SUCCESS) failures++;
    }
    for (auto& [p, bytes] : live) {
      if (tagmem_free(p, nullptr) != TAGMEM_SUCCESS) failures++;
    }
    TAGMEM_OK(tagmem_pop_tag());
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(verified.load(), 0u);
  for (int i = 0; i < kThreads; ++i) {
    tagmem_tag_stats s{};
    TAGMEM_OK(tagmem_tag_stats_get(("thread" + std::to_string(i)).c_str(), 0, &s));
    EXPECT_EQ(s.live_allocations, 0u);
    EXPECT_EQ(s.offload_count, static_cast<std::uint64_t>(kRounds));
  }
}

}  // namespace
}  // namespace tagmem::test
