// The structs of the C ABI at the size the caller states (Note [sized structs] in
// allocator/api/sized_struct.hpp), through libtagmem.so as a program links it: an older caller's
// smaller struct gets its prefix and no byte after it, a newer caller's larger one gets zeros past
// the library's fields, and sizes that are no version's are refused without a byte touched.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tagmem/tagmem.h"

namespace {

constexpr std::size_t kFirstConfig = offsetof(tagmem_config, host_max_bytes);
constexpr std::size_t kFirstTagStats = offsetof(tagmem_tag_stats, peak_allocated_bytes);
constexpr std::size_t kFirstDeviceStats = offsetof(tagmem_device_stats, host_budget_bytes);

// A caller's struct of `size` bytes followed by guard bytes, all random.
class caller_buffer {
 public:
  caller_buffer(std::size_t size, std::mt19937_64& rng) : size_(size), bytes_(size + 64) {
    for (auto& b : bytes_) b = static_cast<unsigned char>(rng());
    initial_ = bytes_;
  }
  void* data() { return bytes_.data(); }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  bool guard_intact() const {
    return std::memcmp(bytes_.data() + size_, initial_.data() + size_, 64) == 0;
  }
  bool untouched() const { return bytes_ == initial_; }
  bool zero_from(std::size_t from) const {
    for (std::size_t i = from; i < size_; ++i)
      if (bytes_[i] != 0) return false;
    return true;
  }

 private:
  std::size_t size_;
  std::vector<unsigned char> bytes_;
  std::vector<unsigned char> initial_;
};

class SizedStruct : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    size_ = 4096 + rng_() % 4096;
    ASSERT_EQ(tagmem_malloc_tagged(&p_, size_, "sized", 0, nullptr), TAGMEM_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(tagmem_free(p_, nullptr), TAGMEM_SUCCESS);
    EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  }
  std::mt19937_64 rng_{std::random_device{}()};
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

TEST_F(SizedStruct, ConfigInitWritesTheCallersSizeOnly) {
  for (std::size_t size : {kFirstConfig, sizeof(tagmem_config), sizeof(tagmem_config) + 24}) {
    caller_buffer b(size, rng_);
    tagmem_config_init_sized(b.as<tagmem_config>(), size);
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(b.as<tagmem_config>()->struct_size, size);
    EXPECT_TRUE(b.zero_from(sizeof(std::size_t))) << size;
  }
  for (std::size_t size : {std::size_t{0}, kFirstConfig - 8, std::size_t{1} << 20}) {
    caller_buffer b(std::min<std::size_t>(size, 256), rng_);
    tagmem_config_init_sized(b.as<tagmem_config>(), size);
    EXPECT_TRUE(b.untouched()) << size;
  }
  tagmem_config macro = TAGMEM_CONFIG_INIT;
  EXPECT_EQ(macro.struct_size, sizeof(tagmem_config));
  tagmem_config c;
  std::memset(&c, 0xa5, sizeof c);
  tagmem_config_init(&c);
  EXPECT_EQ(c.struct_size, sizeof(tagmem_config));
  EXPECT_EQ(c.host_max_bytes, 0u);
}

TEST_F(SizedStruct, InitReadsTheCallersSizeOnly) {
  ASSERT_EQ(tagmem_free(p_, nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  // The first release's config: the random bytes after it would be a refused host_max_bytes.
  caller_buffer old(kFirstConfig, rng_);
  reinterpret_cast<unsigned char*>(old.data())[kFirstConfig + 7] |= 0x80;
  tagmem_config_init_sized(old.as<tagmem_config>(), kFirstConfig);
  old.as<tagmem_config>()->chunk_bytes = 4 << 20;
  ASSERT_EQ(tagmem_init(old.as<tagmem_config>()), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_malloc_tagged(&p_, size_, "sized", 0, nullptr), TAGMEM_SUCCESS);
  tagmem_tag_stats s;
  ASSERT_EQ(tagmem_tag_stats_get("sized", 0, &s), TAGMEM_SUCCESS);
  EXPECT_EQ(s.mapped_bytes, 4u << 20);  // the old struct's field was taken
  ASSERT_EQ(tagmem_free(p_, nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);

  // A newer caller's: zeros past this library's fields are fine, a set byte is refused.
  caller_buffer newer(sizeof(tagmem_config) + 16, rng_);
  tagmem_config_init_sized(newer.as<tagmem_config>(), sizeof(tagmem_config) + 16);
  ASSERT_EQ(tagmem_init(newer.as<tagmem_config>()), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  reinterpret_cast<unsigned char*>(newer.data())[sizeof(tagmem_config) + 3] = 1;
  EXPECT_EQ(tagmem_init(newer.as<tagmem_config>()), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("tagmem_config"), std::string::npos);

  // struct_size of no version: uninitialised, or zero.
  tagmem_config bad{};
  EXPECT_EQ(tagmem_init(&bad), TAGMEM_ERROR_INVALID_ARGUMENT);
  bad.struct_size = rng_() | (std::size_t{1} << 40);
  EXPECT_EQ(tagmem_init(&bad), TAGMEM_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_malloc_tagged(&p_, size_, "sized", 0, nullptr), TAGMEM_SUCCESS);
}

TEST_F(SizedStruct, TagStatsAtEverySize) {
  tagmem_tag_stats full;
  ASSERT_EQ(tagmem_tag_stats_get("sized", 0, &full), TAGMEM_SUCCESS);
  EXPECT_EQ(full.requested_bytes, size_);
  EXPECT_GE(full.peak_allocated_bytes, size_);
  // The first release's size, a size between versions, the release before parked_bytes, ours,
  // and a newer header's.
  for (std::size_t size :
       {kFirstTagStats, kFirstTagStats + 8, offsetof(tagmem_tag_stats, parked_bytes),
        sizeof(tagmem_tag_stats), sizeof(tagmem_tag_stats) + 40}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(tagmem_tag_stats_get_sized("sized", 0, b.as<tagmem_tag_stats>(), size),
              TAGMEM_SUCCESS);
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(std::memcmp(b.data(), &full, std::min(size, sizeof full)), 0) << size;
    EXPECT_TRUE(b.zero_from(sizeof full)) << size;
  }
  for (std::size_t size : {std::size_t{0}, std::size_t{8}, kFirstTagStats - 8, std::size_t{8192}}) {
    caller_buffer b(std::min<std::size_t>(size, 256), rng_);
    EXPECT_EQ(tagmem_tag_stats_get_sized("sized", 0, b.as<tagmem_tag_stats>(), size),
              TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(b.untouched()) << size;
  }
}

TEST_F(SizedStruct, DeviceStatsAtEverySize) {
  for (std::size_t size :
       {kFirstDeviceStats, sizeof(tagmem_device_stats), sizeof(tagmem_device_stats) + 16}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(tagmem_device_stats_get_sized(0, b.as<tagmem_device_stats>(), size), TAGMEM_SUCCESS);
    EXPECT_TRUE(b.guard_intact()) << size;
    const tagmem_device_stats* s = b.as<tagmem_device_stats>();
    EXPECT_GE(s->allocated_bytes, size_);
    EXPECT_EQ(s->tags, 1u);
    if (size >= sizeof(tagmem_device_stats)) {
      EXPECT_GT(s->host_budget_bytes, 0u);
    }
    EXPECT_TRUE(b.zero_from(sizeof(tagmem_device_stats))) << size;
  }
  for (std::size_t size : {std::size_t{0}, kFirstDeviceStats - 1, std::size_t{4097}}) {
    caller_buffer b(std::min<std::size_t>(size, 256), rng_);
    EXPECT_EQ(tagmem_device_stats_get_sized(0, b.as<tagmem_device_stats>(), size),
              TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(b.untouched()) << size;
  }
}

}  // namespace
