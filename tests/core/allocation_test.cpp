// allocation_test.cpp — the caching sub-allocator seen through the C API: alignment, tags,
// scopes, reuse, streams and empty_cache.
#include <set>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class Allocation : public tagmem_test {};

TEST_F(Allocation, AllocationsAreAlignedDistinctAndHoldTheirBytes) {
  auto rng = rng_for_test();
  std::vector<std::pair<void*, std::vector<unsigned char>>> live;
  std::set<std::uintptr_t> starts;
  for (int i = 0; i < 300; ++i) {
    std::size_t size = 1 + rng() % (i % 10 == 0 ? (8u << 20) : 4096u);
    void* p = nullptr;
    TAGMEM_OK(tagmem_malloc_tagged(&p, size, "alloc", 0, nullptr));
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
    ASSERT_TRUE(starts.insert(reinterpret_cast<std::uintptr_t>(p)).second);
    live.emplace_back(p, random_bytes(rng, size));
    write_device(p, live.back().second.data(), size);
  }
  for (auto& [p, bytes] : live) ASSERT_EQ(read_device(p, bytes.size()), bytes);
  for (auto& [p, bytes] : live) TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Allocation, AllocationLandsInTheCurrentTagAndScopesNest) {
  EXPECT_STREQ(tagmem_current_tag(), TAGMEM_DEFAULT_TAG);
  TAGMEM_OK(tagmem_push_tag("outer"));
  TAGMEM_OK(tagmem_push_tag("inner"));
  void* a = nullptr;
  TAGMEM_OK(tagmem_malloc(&a, 1000, 0, nullptr));
  TAGMEM_OK(tagmem_pop_tag());
  void* b = nullptr;
  TAGMEM_OK(tagmem_malloc(&b, 1000, 0, nullptr));
  TAGMEM_OK(tagmem_pop_tag());
  void* c = nullptr;
  TAGMEM_OK(tagmem_malloc(&c, 1000, 0, nullptr));

  char name[TAGMEM_MAX_TAG_NAME + 1];
  void* base = nullptr;
  std::size_t size = 0;
  int dev = -5;
  TAGMEM_OK(tagmem_pointer_info(static_cast<char*>(a) + 10, name, sizeof name, &dev, &base, &size));
  EXPECT_STREQ(name, "inner");
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(base, a);
  EXPECT_EQ(size, 1000u);
  TAGMEM_OK(tagmem_pointer_info(b, name, sizeof name, nullptr, nullptr, nullptr));
  EXPECT_STREQ(name, "outer");
  TAGMEM_OK(tagmem_pointer_info(c, name, sizeof name, nullptr, nullptr, nullptr));
  EXPECT_STREQ(name, TAGMEM_DEFAULT_TAG);
  for (void* p : {a, b, c}) TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Allocation, SmallRequestsSharePhysicalChunks) {
  std::vector<void*> ptrs(64);
  for (void*& p : ptrs) TAGMEM_OK(tagmem_malloc_tagged(&p, 4000, "small", 0, nullptr));
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("small", 0, &s));
  EXPECT_EQ(s.mapped_bytes, 2u << 20);  // 64 x 4 KiB fit in one 2 MiB chunk
  EXPECT_EQ(s.mappings, 1u);
  EXPECT_EQ(s.live_allocations, 64u);
  EXPECT_EQ(s.requested_bytes, 64u * 4000u);
  EXPECT_EQ(s.allocated_bytes, 64u * 4096u);
  for (void* p : ptrs) TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Allocation, FreedBlocksAreReusedOnTheSameStream) {
  void* a = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&a, 3 << 20, "reuse", 0, nullptr));
  TAGMEM_OK(tagmem_free(a, nullptr));
  void* b = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&b, 3 << 20, "reuse", 0, nullptr));
  EXPECT_EQ(a, b);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("reuse", 0, &s));
  EXPECT_EQ(s.mappings, 1u);
  EXPECT_EQ(s.alloc_count, 2u);
  EXPECT_EQ(s.free_count, 1u);
  TAGMEM_OK(tagmem_free(b, nullptr));
}

TEST_F(Allocation, ReuseAcrossStreamsIsOrderedAfterTheFreeingStream) {
  auto rng = rng_for_test();
  const auto& api = driver_api_for_tests();
  CUstream s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(api.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::size_t n = 8 << 20;
  auto first = random_bytes(rng, n);
  auto second = random_bytes(rng, n);
  std::vector<unsigned char> out(n);
  void* a = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&a, n, "streams", 0, s1));
  // Queue work on s1 that reads the block, then free it on s1 before that work has run.
  ASSERT_EQ(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(a), first.data(), n, s1),
            CUDA_SUCCESS);
  ASSERT_EQ(api.cuMemcpyDtoHAsync(out.data(), reinterpret_cast<CUdeviceptr>(a), n, s1),
            CUDA_SUCCESS);
  TAGMEM_OK(tagmem_free(a, s1));
  void* b = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&b, n, "streams", 0, s2));
  EXPECT_EQ(a, b);  // reused across streams...
  ASSERT_EQ(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(b), second.data(), n, s2),
            CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamSynchronize(s2), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamSynchronize(s1), CUDA_SUCCESS);
  EXPECT_EQ(out, first);  // ...but s2's write came after s1's read
  EXPECT_EQ(read_device(b, n), second);
  TAGMEM_OK(tagmem_free(b, s2));
  api.cuStreamDestroy(s1);
  api.cuStreamDestroy(s2);
}

// Note [stream-ordered reuse] in block_pool.hpp: a stream takes its own cached block first, even
// where another stream's fits better; a stream with no fitting block of its own takes the best
// fit among the other streams' blocks.
TEST_F(Allocation, ReuseTakesTheOwnStreamsBlockFirstThenTheBestFitOfOtherStreams) {
  auto rng = rng_for_test();
  const auto& api = driver_api_for_tests();
  CUstream s1 = nullptr, s2 = nullptr, s3 = nullptr;
  ASSERT_EQ(api.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::size_t mib = 1 << 20;  // above 10 MiB every request has a segment of its own
  void* big = nullptr;
  void* fit = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&big, 16 * mib, "streams", 0, s1));
  TAGMEM_OK(tagmem_malloc_tagged(&fit, 12 * mib, "streams", 0, s2));
  TAGMEM_OK(tagmem_free(big, s1));
  TAGMEM_OK(tagmem_free(fit, s2));
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 12 * mib, "streams", 0, s1));
  EXPECT_EQ(p, big);  // s1's own block, though s2's fits better
  TAGMEM_OK(tagmem_free(p, s1));
  TAGMEM_OK(tagmem_malloc_tagged(&p, 12 * mib, "streams", 0, s3));
  EXPECT_EQ(p, fit);  // s3 has none: the best fit of s1's and s2's
  void* q = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&q, 14 * mib, "streams", 0, s3));
  EXPECT_EQ(q, big);  // the only block left that fits
  const auto bytes = random_bytes(rng, 12 * mib);
  ASSERT_EQ(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(p), bytes.data(), bytes.size(), s3),
            CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamSynchronize(s3), CUDA_SUCCESS);
  EXPECT_EQ(read_device(p, bytes.size()), bytes);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("streams", 0, &s));
  EXPECT_EQ(s.reserved_bytes, 28 * mib);  // no segment was made for the reuses
  TAGMEM_OK(tagmem_free(p, s3));
  TAGMEM_OK(tagmem_free(q, s3));
  api.cuStreamDestroy(s1);
  api.cuStreamDestroy(s2);
  api.cuStreamDestroy(s3);
}

// Note [stream-ordered reuse]: neighbouring free blocks merge only when one stream may reuse both.
TEST_F(Allocation, FreeNeighboursMergeOnlyWithinOneStream) {
  const auto& api = driver_api_for_tests();
  CUstream s1 = nullptr, s2 = nullptr, s3 = nullptr;
  ASSERT_EQ(api.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* x = nullptr;
  void* y = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&x, 4096, "merge", 0, s1));
  TAGMEM_OK(tagmem_malloc_tagged(&y, 4096, "merge", 0, s1));
  ASSERT_EQ(static_cast<char*>(y), static_cast<char*>(x) + 4096);  // the rest of the chunk follows
  char* const rest = static_cast<char*>(x) + 8192;                 // cached for s1
  TAGMEM_OK(tagmem_free(x, s2));
  TAGMEM_OK(tagmem_free(y, s3));
  void* z = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&z, 8192, "merge", 0, s2));
  EXPECT_EQ(z, rest);             // x and y stayed apart: neither fits, s1's rest does
  TAGMEM_OK(tagmem_free(z, s1));  // between s3's y and the rest, now s2's: no merge
  TAGMEM_OK(tagmem_malloc_tagged(&y, 4096, "merge", 0, s3));
  EXPECT_EQ(static_cast<char*>(y), static_cast<char*>(x) + 4096);  // s3's own block
  TAGMEM_OK(tagmem_free(y, s2));                                   // now x and y merge
  TAGMEM_OK(tagmem_malloc_tagged(&z, 8192, "merge", 0, s2));
  EXPECT_EQ(z, x);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("merge", 0, &s));
  EXPECT_EQ(s.mappings, 1u);
  TAGMEM_OK(tagmem_free(z, s2));
  api.cuStreamDestroy(s1);
  api.cuStreamDestroy(s2);
  api.cuStreamDestroy(s3);
}

TEST_F(Allocation, EmptyCacheReturnsIdleChunksAndKeepsLiveOnes) {
  auto rng = rng_for_test();
  std::vector<void*> big(4);
  for (void*& p : big) TAGMEM_OK(tagmem_malloc_tagged(&p, 32 << 20, "cache", 0, nullptr));
  void* keep = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&keep, 5 << 20, "cache", 0, nullptr));
  auto bytes = random_bytes(rng, 5 << 20);
  write_device(keep, bytes.data(), bytes.size());
  tagmem_tag_stats before{};
  TAGMEM_OK(tagmem_tag_stats_get("cache", 0, &before));
  std::size_t free_before = device_free_bytes();
  for (void* p : big) TAGMEM_OK(tagmem_free(p, nullptr));
  tagmem_tag_stats cached{};
  TAGMEM_OK(tagmem_tag_stats_get("cache", 0, &cached));
  EXPECT_EQ(cached.mapped_bytes, before.mapped_bytes);  // freed blocks stay cached
  TAGMEM_OK(tagmem_empty_cache(0));
  tagmem_tag_stats after{};
  TAGMEM_OK(tagmem_tag_stats_get("cache", 0, &after));
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes - 4 * (32u << 20));
  EXPECT_EQ(after.reserved_bytes, after.mapped_bytes);
  EXPECT_GE(device_free_bytes(), free_before + 4 * (32u << 20));
  EXPECT_EQ(read_device(keep, bytes.size()), bytes);
  TAGMEM_OK(tagmem_free(keep, nullptr));
}

// tagmem.h: a tag exists from its first push on the pushing thread's current device.
TEST_F(Allocation, PushCreatesTheTagOnTheCurrentDevice) {
  tagmem_tag_stats s{};
  TAGMEM_FAILS_WITH(tagmem_tag_stats_get("pushed", 0, &s), TAGMEM_ERROR_UNKNOWN_TAG);
  TAGMEM_OK(tagmem_push_tag("pushed"));  // the fixture keeps device 0's context current
  TAGMEM_OK(tagmem_tag_stats_get("pushed", 0, &s));
  EXPECT_EQ(s.state, TAGMEM_RESIDENT);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.mapped_bytes, 0u);
  char names[8][TAGMEM_MAX_TAG_NAME + 1];
  std::size_t count = 0;
  TAGMEM_OK(tagmem_list_tags(0, names, 8, &count));
  ASSERT_EQ(count, 1u);
  EXPECT_STREQ(names[0], "pushed");
  // An existing tag is offloadable and reloadable before anything was allocated in it.
  const char* tags[] = {"pushed"};
  TAGMEM_OK(tagmem_offload(tags, 1, TAGMEM_CURRENT_DEVICE, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, TAGMEM_CURRENT_DEVICE));
  // Pushing it again creates nothing new; popping removes nothing.
  TAGMEM_OK(tagmem_push_tag("pushed"));
  TAGMEM_OK(tagmem_pop_tag());
  TAGMEM_OK(tagmem_pop_tag());
  TAGMEM_OK(tagmem_list_tags(0, names, 8, &count));
  EXPECT_EQ(count, 1u);
  // A refused name creates nothing.
  TAGMEM_FAILS_WITH(tagmem_push_tag("bad name"), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_OK(tagmem_list_tags(0, names, 8, &count));
  EXPECT_EQ(count, 1u);
  // An allocation in the scope lands in the tag the push created.
  auto rng = rng_for_test();
  TAGMEM_OK(tagmem_push_tag("pushed"));
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc(&p, 5000, 0, nullptr));
  TAGMEM_OK(tagmem_pop_tag());
  auto bytes = random_bytes(rng, 5000);
  write_device(p, bytes.data(), bytes.size());
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(read_device(p, bytes.size()), bytes);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Allocation, TagsAreListedPerDevice) {
  void* a = nullptr;
  void* b = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&a, 10, "list_a", 0, nullptr));
  TAGMEM_OK(tagmem_malloc_tagged(&b, 10, "list_b", 0, nullptr));
  char names[8][TAGMEM_MAX_TAG_NAME + 1];
  std::size_t count = 0;
  TAGMEM_OK(tagmem_list_tags(0, names, 8, &count));
  ASSERT_EQ(count, 2u);
  EXPECT_STREQ(names[0], "list_a");
  EXPECT_STREQ(names[1], "list_b");
  TAGMEM_OK(tagmem_free(a, nullptr));
  TAGMEM_OK(tagmem_free(b, nullptr));
}

}  // namespace
}  // namespace tagmem::test
