// margin_test.cpp — tagmem_set_memory_margin(): allocations that would leave less free device
// memory than the margin fail with OUT_OF_MEMORY and change nothing; the margin can be lifted.
#include "test_support.hpp"

namespace tagmem::test {
namespace {

class Margin : public tagmem_test {
 protected:
  void TearDown() override {
    tagmem_set_memory_margin(0);
    tagmem_test::TearDown();
  }
};

TEST_F(Margin, RequestsThatWouldCrossTheMarginFailAndOthersSucceed) {
  constexpr std::size_t MiB = 1 << 20;
  EXPECT_EQ(tagmem_memory_margin(), 0u);
  void* warm = nullptr;  // the device's context and first chunk exist before free memory is read
  TAGMEM_OK(tagmem_malloc_tagged(&warm, 1, "w", 0, nullptr));
  const std::size_t free_now = device_free_bytes();
  ASSERT_GT(free_now, 512 * MiB);
  tagmem_set_memory_margin(free_now - 64 * MiB);  // leaves ~64 MiB for tagmem
  EXPECT_EQ(tagmem_memory_margin(), free_now - 64 * MiB);
  tagmem_tag_stats before{};
  TAGMEM_OK(tagmem_tag_stats_get("w", 0, &before));
  void* p = reinterpret_cast<void*>(0x1);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 256 * MiB, "w", 0, nullptr),
                    TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(p, nullptr);
  tagmem_tag_stats after{};
  TAGMEM_OK(tagmem_tag_stats_get("w", 0, &after));
  EXPECT_EQ(after.alloc_count, before.alloc_count);
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
  void* fits = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&fits, 8 * MiB, "w", 0, nullptr));
  tagmem_set_memory_margin(free_now * 2);  // more than the device has: nothing fits
  TAGMEM_FAILS_WITH(tagmem_malloc(&p, 1, 0, nullptr), TAGMEM_ERROR_OUT_OF_MEMORY);
  tagmem_set_memory_margin(0);
  TAGMEM_OK(tagmem_malloc_tagged(&p, 256 * MiB, "w", 0, nullptr));
  for (void* q : {warm, fits, p}) TAGMEM_OK(tagmem_free(q, nullptr));
}

}  // namespace
}  // namespace tagmem::test
