// offload_test.cpp — offload and reload: bytes and addresses survive, DISCARD copies nothing,
// statistics match what the driver sees, reload coalesces, swap and lists of tags.
#include <algorithm>
#include <cmath>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class Offload : public tagmem_test {};

// `count` allocations of mixed sizes (log-uniform from 1 byte to `max_size`) in `tag`, each
// filled with random bytes.
std::vector<filled> fill_tag(std::mt19937_64& rng, const char* tag, int count,
                             std::size_t max_size) {
  std::vector<filled> out;
  std::uniform_real_distribution<double> log_size(0.0, std::log2(static_cast<double>(max_size)));
  for (int i = 0; i < count; ++i) {
    auto size = static_cast<std::size_t>(std::exp2(log_size(rng)));
    size = std::max<std::size_t>(size, 1);
    void* p = nullptr;
    EXPECT_EQ(tagmem_malloc_tagged(&p, size, tag, 0, nullptr), TAGMEM_SUCCESS)
        << tagmem_last_error();
    out.push_back({p, random_bytes(rng, size)});
    write_device(p, out.back().bytes.data(), size);
  }
  return out;
}

void expect_intact(const std::vector<filled>& all) {
  EXPECT_EQ(corrupted(all), 0u) << "allocations whose bytes changed";
}

std::size_t total_requested(const std::vector<filled>& all) {
  std::size_t n = 0;
  for (const auto& a : all) n += a.bytes.size();
  return n;
}

TEST_F(Offload, RandomBytesSurviveManyCyclesAtTheSameAddresses) {
  auto rng = rng_for_test();
  auto all = fill_tag(rng, "weights", 3000, 1 << 20);
  auto big = fill_tag(rng, "weights", 4, 48 << 20);
  all.insert(all.end(), big.begin(), big.end());
  const char* tags[] = {"weights"};
  for (int cycle = 0; cycle < 6; ++cycle) {
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
    tagmem_tag_stats s{};
    TAGMEM_OK(tagmem_tag_stats_get("weights", 0, &s));
    EXPECT_EQ(s.state, TAGMEM_OFFLOADED_BACKUP);
    EXPECT_EQ(s.mapped_bytes, 0u);
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
    expect_intact(all);  // read through the same pointers: same addresses
    // Rewrite a random tenth so every cycle moves fresh data.
    for (auto& a : all) {
      if (rng() % 10) continue;
      a.bytes = random_bytes(rng, a.bytes.size());
      write_device(a.ptr, a.bytes.data(), a.bytes.size());
    }
  }
  for (auto& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

TEST_F(Offload, StatsMatchTheDriverAcrossACycle) {
  auto rng = rng_for_test();
  auto all = fill_tag(rng, "kv", 200, 4 << 20);
  tagmem_tag_stats resident{};
  TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &resident));
  EXPECT_EQ(resident.state, TAGMEM_RESIDENT);
  EXPECT_EQ(resident.live_allocations, all.size());
  EXPECT_EQ(resident.requested_bytes, total_requested(all));
  EXPECT_EQ(resident.mapped_bytes, resident.reserved_bytes);
  EXPECT_EQ(resident.mapped_bytes % (2u << 20), 0u);
  EXPECT_EQ(resident.host_bytes, 0u);

  std::size_t free_before = device_free_bytes();
  const char* tags[] = {"kv"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  tagmem_tag_stats off{};
  TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &off));
  EXPECT_EQ(off.mapped_bytes, 0u);
  EXPECT_EQ(off.host_bytes, resident.mapped_bytes);
  EXPECT_EQ(off.bytes_offloaded, resident.mapped_bytes);
  EXPECT_EQ(off.live_allocations, all.size());  // allocations outlive the offload
  EXPECT_GE(device_free_bytes(), free_before + resident.mapped_bytes);
  tagmem_device_stats ds{};
  TAGMEM_OK(tagmem_device_stats_get(0, &ds));
  EXPECT_GE(ds.host_used_bytes, resident.mapped_bytes);
  EXPECT_GE(ds.host_pinned_bytes, ds.host_used_bytes);

  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  tagmem_tag_stats back{};
  TAGMEM_OK(tagmem_tag_stats_get("kv", 0, &back));
  EXPECT_EQ(back.state, TAGMEM_RESIDENT);
  EXPECT_EQ(back.mapped_bytes, resident.mapped_bytes);
  EXPECT_EQ(back.host_bytes, 0u);
  EXPECT_EQ(back.bytes_reloaded, resident.mapped_bytes);
  EXPECT_LE(back.mappings, resident.mappings);  // coalesced
  EXPECT_EQ(back.offload_count, 1u);
  EXPECT_EQ(back.reload_count, 1u);
  expect_intact(all);
  for (auto& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

TEST_F(Offload, ReloadCoalescesManyChunksIntoFewMappings) {
  auto rng = rng_for_test();
  auto all = fill_tag(rng, "many", 400, 512 << 10);  // small segments: many 2 MiB chunks
  tagmem_tag_stats before{};
  TAGMEM_OK(tagmem_tag_stats_get("many", 0, &before));
  ASSERT_GT(before.mappings, 4u);
  const char* tags[] = {"many"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  tagmem_tag_stats after{};
  TAGMEM_OK(tagmem_tag_stats_get("many", 0, &after));
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
  EXPECT_LT(after.mappings, before.mappings);
  EXPECT_LE(after.mappings, before.mapped_bytes / (1ull << 30) + 1);
  expect_intact(all);
  // Freeing everything and emptying the cache gives back the coalesced mappings too.
  for (auto& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
  TAGMEM_OK(tagmem_empty_cache(0));
  TAGMEM_OK(tagmem_tag_stats_get("many", 0, &after));
  EXPECT_EQ(after.mapped_bytes, 0u);
  EXPECT_EQ(after.reserved_bytes, 0u);
}

TEST_F(Offload, DiscardReleasesWithoutCopying) {
  auto rng = rng_for_test();
  auto all = fill_tag(rng, "kv_cache", 100, 8 << 20);
  tagmem_tag_stats resident{};
  TAGMEM_OK(tagmem_tag_stats_get("kv_cache", 0, &resident));
  tagmem_device_stats ds_before{};
  TAGMEM_OK(tagmem_device_stats_get(0, &ds_before));
  std::size_t free_before = device_free_bytes();
  const char* tags[] = {"kv_cache"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
  tagmem_tag_stats off{};
  TAGMEM_OK(tagmem_tag_stats_get("kv_cache", 0, &off));
  EXPECT_EQ(off.state, TAGMEM_OFFLOADED_DISCARD);
  EXPECT_EQ(off.mapped_bytes, 0u);
  EXPECT_EQ(off.host_bytes, 0u);
  EXPECT_EQ(off.bytes_offloaded, 0u);
  tagmem_device_stats ds{};
  TAGMEM_OK(tagmem_device_stats_get(0, &ds));
  EXPECT_LE(ds.release_pending_bytes, resident.mapped_bytes);
  // Released in the background (Note [background release]); waiting makes it all free.
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_GE(device_free_bytes(), free_before + resident.mapped_bytes);
  TAGMEM_OK(tagmem_device_stats_get(0, &ds));
  EXPECT_EQ(ds.release_pending_bytes, 0u);
  EXPECT_EQ(ds.host_used_bytes, ds_before.host_used_bytes);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_tag_stats_get("kv_cache", 0, &off));
  EXPECT_EQ(off.state, TAGMEM_RESIDENT);
  EXPECT_EQ(off.mapped_bytes, resident.mapped_bytes);
  EXPECT_EQ(off.bytes_reloaded, 0u);
  // The memory is usable again at the same addresses.
  for (auto& a : all) {
    a.bytes = random_bytes(rng, a.bytes.size());
    write_device(a.ptr, a.bytes.data(), a.bytes.size());
  }
  expect_intact(all);
  for (auto& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

TEST_F(Offload, SeveralTagsInOneCallAndSwap) {
  auto rng = rng_for_test();
  auto trainer_w = fill_tag(rng, "trainer_weights", 50, 8 << 20);
  auto optimizer = fill_tag(rng, "optimizer", 50, 8 << 20);
  auto engine_w = fill_tag(rng, "engine_weights", 50, 8 << 20);
  const char* engine[] = {"engine_weights"};
  TAGMEM_OK(tagmem_offload(engine, 1, 0, TAGMEM_BACKUP));
  const char* trainer[] = {"trainer_weights", "optimizer"};
  for (int cycle = 0; cycle < 3; ++cycle) {
    TAGMEM_OK(tagmem_swap(trainer, 2, engine, 1, 0, TAGMEM_BACKUP));
    expect_intact(engine_w);
    TAGMEM_OK(tagmem_swap(engine, 1, trainer, 2, 0, TAGMEM_BACKUP));
    expect_intact(trainer_w);
    expect_intact(optimizer);
  }
  TAGMEM_OK(tagmem_reload(engine, 1, 0));
  expect_intact(engine_w);
  for (auto* v : {&trainer_w, &optimizer, &engine_w})
    for (auto& a : *v) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

TEST_F(Offload, EmptyTagOffloadsAndRefusesAllocationUntilReloaded) {
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 100, "empty", 0, nullptr));
  TAGMEM_OK(tagmem_free(p, nullptr));
  TAGMEM_OK(tagmem_empty_cache(0));
  const char* tags[] = {"empty"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 100, "empty", 0, nullptr), TAGMEM_ERROR_TAG_OFFLOADED);
  EXPECT_EQ(p, nullptr);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_malloc_tagged(&p, 100, "empty", 0, nullptr));
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Offload, FreeingInAnOffloadedTagIsBookkeepingAndReloadKeepsTheRest) {
  auto rng = rng_for_test();
  auto all = fill_tag(rng, "mixed", 100, 2 << 20);
  const char* tags[] = {"mixed"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  for (std::size_t i = 0; i < all.size(); i += 2) TAGMEM_OK(tagmem_free(all[i].ptr, nullptr));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  for (std::size_t i = 1; i < all.size(); i += 2) {
    EXPECT_EQ(read_device(all[i].ptr, all[i].bytes.size()), all[i].bytes);
    TAGMEM_OK(tagmem_free(all[i].ptr, nullptr));
  }
}

}  // namespace
}  // namespace tagmem::test
