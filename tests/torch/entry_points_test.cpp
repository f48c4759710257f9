// entry_points_test.cpp — the PyTorch entry points (integrations/torch/entry_points.cpp) from C++:
// what the Python tests cannot reach through ctypes. The global entry point's failure throws a C++
// exception (PyTorch turns it into a RuntimeError), and slot allocations race from plain threads
// with no interpreter in the way. Runs on the emulated driver (label emu) and a GPU (label gpu).
#include "entry_points.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tagmem/tagmem.hpp"

extern "C" void* tagmem_torch_alloc_5(size_t size, int device, tagmem_stream stream);

namespace {

class TorchEntryPoints : public ::testing::Test {
 protected:
  void TearDown() override { tagmem_shutdown(); }
};

std::string tag_of(void* p) {
  char name[TAGMEM_MAX_TAG_NAME + 1] = {};
  tagmem::check(tagmem_pointer_info(p, name, sizeof(name), nullptr, nullptr, nullptr));
  return name;
}

TEST_F(TorchEntryPoints, GlobalAllocationFailureThrowsWithTagmemsMessage) {
  void* p = nullptr;
  {
    tagmem::tag_scope scope("cxx_global");
    p = tagmem_torch_alloc(4096, 0, nullptr);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(tag_of(p), "cxx_global");
    tagmem::offload({"cxx_global"});
    const uint64_t failures = tagmem_torch_failures();
    try {
      tagmem_torch_alloc(4096, 0, nullptr);
      FAIL() << "allocation in an offloaded tag did not throw";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::strstr(e.what(), "TAGMEM_ERROR_TAG_OFFLOADED"), nullptr) << e.what();
      EXPECT_NE(std::strstr(e.what(), "cxx_global"), nullptr) << e.what();
    }
    EXPECT_EQ(tagmem_torch_failures(), failures + 1);
    char message[256];
    EXPECT_GT(tagmem_torch_last_failure(message, sizeof(message)), 0u);
    EXPECT_NE(std::strstr(message, "TAGMEM_ERROR_TAG_OFFLOADED"), nullptr) << message;
  }
  tagmem_torch_free(p, 4096, 0, nullptr);  // freeing in an offloaded tag is bookkeeping
  EXPECT_EQ(tagmem::tag_stats("cxx_global", 0).live_allocations, 0u);
}

TEST_F(TorchEntryPoints, SlotServesEveryThreadInItsTag) {
  ASSERT_EQ(tagmem_torch_bind_slot(5, "cxx_slot"), TAGMEM_SUCCESS) << tagmem_torch_bind_error();
  constexpr int kThreads = 8, kPerThread = 200;
  std::vector<std::vector<void*>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &got] {
      tagmem::tag_scope unrelated("cxx_thread_scope");  // must not matter for a slot
      for (int i = 0; i < kPerThread; ++i) {
        got[t].push_back(tagmem_torch_alloc_5(512 + 64 * (i % 37), 0, nullptr));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& list : got) {
    for (void* p : list) {
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(tag_of(p), "cxx_slot");
      tagmem_torch_free(p, 0, 0, nullptr);
    }
  }
  auto stats = tagmem::tag_stats("cxx_slot", 0);
  EXPECT_EQ(stats.alloc_count, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(stats.live_allocations, 0u);
}

TEST_F(TorchEntryPoints, SlotKeepsItsFirstTag) {
  ASSERT_EQ(tagmem_torch_bind_slot(6, "cxx_first"), TAGMEM_SUCCESS);
  EXPECT_EQ(tagmem_torch_bind_slot(6, "cxx_first"), TAGMEM_SUCCESS);
  EXPECT_EQ(tagmem_torch_bind_slot(6, "cxx_second"), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(tagmem_torch_bind_error(), "cxx_first"), nullptr);
  EXPECT_STREQ(tagmem_torch_slot_tag(6), "cxx_first");
  EXPECT_EQ(tagmem_torch_bind_slot(TAGMEM_TORCH_SLOTS, "x"), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tagmem_torch_bind_slot(7, ""), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tagmem_torch_slot_tag(7), nullptr);
}

}  // namespace
