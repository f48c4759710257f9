// runtime_test.cpp — the cudaMalloc/cudaFree interposers, over a stand-in for a dynamically
// linked CUDA runtime (fake_cudart.c): inside a tag scope (or with TAGMEM_PRELOAD_TAG) memory
// comes from tagmem and survives offload/reload at the same address; otherwise the runtime's
// own function serves it untouched.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "nccl_way.hpp"
#include "tagmem/tagmem.h"

extern "C" {
int cudaMalloc(void** ptr, size_t size);
int cudaMallocAsync(void** ptr, size_t size, void* stream);
int cudaFree(void* ptr);
int cudaFreeAsync(void* ptr, void* stream);
std::uint64_t tagmem_fake_cudart_calls(void);
}

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

// tagmem's C ABI, exported by the preloaded shim.
struct api {
  template <class F>
  static F get(const char* name) {
    return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  }
  decltype(&::tagmem_push_tag) push = get<decltype(&::tagmem_push_tag)>("tagmem_push_tag");
  decltype(&::tagmem_pop_tag) pop = get<decltype(&::tagmem_pop_tag)>("tagmem_pop_tag");
  decltype(&::tagmem_pointer_info) info =
      get<decltype(&::tagmem_pointer_info)>("tagmem_pointer_info");
  decltype(&::tagmem_offload) offload = get<decltype(&::tagmem_offload)>("tagmem_offload");
  decltype(&::tagmem_reload) reload = get<decltype(&::tagmem_reload)>("tagmem_reload");
  decltype(&::tagmem_tag_stats_get) tag_stats =
      get<decltype(&::tagmem_tag_stats_get)>("tagmem_tag_stats_get");
  decltype(&::tagmem_wait_released) wait_released =
      get<decltype(&::tagmem_wait_released)>("tagmem_wait_released");
};
const api& tm() {
  static api a;
  return a;
}

std::string tag_of(void* p) {
  char tag[TAGMEM_MAX_TAG_NAME + 1] = {};
  if (tm().info(p, tag, sizeof tag, nullptr, nullptr, nullptr) != TAGMEM_SUCCESS) return "";
  return tag;
}

buffer view(void* p, std::size_t size) {
  buffer b;
  b.va = reinterpret_cast<CUdeviceptr>(p);
  b.size = size;
  return b;
}

class Runtime : public ::testing::Test {
 protected:
  void SetUp() override {
    use_device(0);
    ASSERT_EQ(std::getenv("TAGMEM_PRELOAD_TAG"), nullptr) << "run RuntimeDefaultTag.* for that";
  }
};

TEST_F(Runtime, OutsideAScopeCudaMallocPassesThroughToTheRuntime) {
  std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 1);
  EXPECT_EQ(tag_of(p), "") << "not tagmem's";
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 2);
}

TEST_F(Runtime, InsideAScopeCudaMallocAndFreeGoToTagmem) {
  std::uint64_t calls = tagmem_fake_cudart_calls();
  ASSERT_EQ(tm().push("rt-scope"), TAGMEM_SUCCESS);
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 * MiB), 0);
  ASSERT_EQ(cudaMallocAsync(&q, MiB, nullptr), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(tag_of(p), "rt-scope");
  EXPECT_EQ(tag_of(q), "rt-scope");
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 256), 1) << "an interior pointer is invalid";
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(cudaFreeAsync(q, nullptr), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls) << "the runtime saw none of these";
  tagmem_tag_stats st{};
  ASSERT_EQ(tm().tag_stats("rt-scope", 0, &st), TAGMEM_SUCCESS);
  EXPECT_EQ(st.alloc_count, 2u);
  EXPECT_EQ(st.free_count, 2u);
  EXPECT_EQ(st.live_allocations, 0u);
}

TEST_F(Runtime, OffloadAndReloadKeepValuesAndAddresses) {
  ASSERT_EQ(tm().push("rt-offload"), TAGMEM_SUCCESS);
  std::vector<void*> ptrs(3);
  std::vector<std::size_t> sizes = {MiB, 5 * MiB, 300 << 10};
  for (std::size_t i = 0; i < ptrs.size(); ++i) ASSERT_EQ(cudaMalloc(&ptrs[i], sizes[i]), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    write_bytes(view(ptrs[i], sizes[i]), 0, pattern(40 + i, sizes[i]));
  const char* tags[] = {"rt-offload"};
  ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  for (void* p : ptrs) EXPECT_FALSE(readable(reinterpret_cast<CUdeviceptr>(p)));
  ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    EXPECT_EQ(read_bytes(view(ptrs[i], sizes[i]), 0, sizes[i]), pattern(40 + i, sizes[i]));
    EXPECT_EQ(cudaFree(ptrs[i]), 0);
  }
}

TEST_F(Runtime, CudaMallocInAnOffloadedTagIsOutOfMemory) {
  ASSERT_EQ(tm().push("rt-gone"), TAGMEM_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0);
  const char* tags[] = {"rt-gone"};
  ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS);
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, MiB), 2) << "cudaErrorMemoryAllocation";
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
  EXPECT_EQ(cudaFree(p), 0);
  // The discarded memory goes back to the driver on a background thread; later tests in this
  // process count the driver's live allocations, so it must be back before this test ends.
  EXPECT_EQ(tm().wait_released(0), TAGMEM_SUCCESS);
}

TEST(RuntimeDefaultTag, EveryCudaMallocGoesToTheDefaultTagUnlessAScopeSaysOtherwise) {
  const char* tag = std::getenv("TAGMEM_PRELOAD_TAG");
  ASSERT_NE(tag, nullptr) << "this test runs with TAGMEM_PRELOAD_TAG set (ctest does that)";
  use_device(0);
  std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 2 * MiB), 0);
  EXPECT_EQ(tag_of(p), tag);
  ASSERT_EQ(tm().push("scoped"), TAGMEM_SUCCESS);
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&q, MiB), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(tag_of(q), "scoped");
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls);
  write_bytes(view(p, 2 * MiB), 0, pattern(5, 2 * MiB));
  const char* tags[] = {tag};
  ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
  EXPECT_EQ(read_bytes(view(p, 2 * MiB), 0, 2 * MiB), pattern(5, 2 * MiB));
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(cudaFree(q), 0);
  void* none = nullptr;
  EXPECT_EQ(cudaMalloc(&none, 0), 0) << "size 0 is the runtime's business";
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 1);
}

}  // namespace
}  // namespace tagmem::preload_test
