// keep_backup_test.cpp — tagmem_set_keep_backup(): a reload that keeps the BACKUP host copy, read
// through tagmem_host_view() while the tag is resident, replaced by the next offload, given back
// by a reload without the flag, and refused once the tag's allocations change.
#include <cstring>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class KeepBackup : public tagmem_test {};

// The bytes of [ptr, ptr + n) as host views give them; empty if any view fails.
std::vector<unsigned char> host_copy(const void* ptr, std::size_t n) {
  std::vector<unsigned char> out;
  while (out.size() < n) {
    void* host = nullptr;
    std::size_t got = 0;
    if (tagmem_host_view(static_cast<const char*>(ptr) + out.size(), 0, &host, &got) !=
            TAGMEM_SUCCESS ||
        got == 0) {
      return {};
    }
    auto* h = static_cast<const unsigned char*>(host);
    out.insert(out.end(), h, h + std::min(got, n - out.size()));
  }
  return out;
}

// Sets the keep flag on `tag` and runs one offload (in `mode`) and reload of it.
void keeping_cycle(const char* tag, tagmem_offload_mode mode = TAGMEM_BACKUP) {
  const char* tags[] = {tag};
  TAGMEM_OK(tagmem_set_keep_backup(tag, 0, 1));
  TAGMEM_OK(tagmem_offload(tags, 1, 0, mode));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
}

// tagmem_host_view's status for `ptr` (read-only).
tagmem_status view_status(const void* ptr) {
  void* host = nullptr;
  std::size_t n = 0;
  return tagmem_host_view(ptr, 0, &host, &n);
}

std::size_t host_bytes_of(const char* tag) {
  tagmem_tag_stats s{};
  EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.host_bytes;
}

TEST_F(KeepBackup, AKeptBackupIsReadableAfterReloadAndTheNextOffloadReplacesIt) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 3, (3 << 20) + 999);
  const char* tags[] = {"w"};
  keeping_cycle("w");
  EXPECT_EQ(corrupted(all), 0u);
  EXPECT_GT(host_bytes_of("w"), 0u) << "the reload gave the backup back";
  for (const auto& a : all) {
    EXPECT_TRUE(host_copy(a.ptr, a.bytes.size()) == a.bytes);
  }
  // A snapshot: new device bytes do not show until the next offload writes them.
  auto snapshot = all[1].bytes;
  auto fresh = random_bytes(rng, all[1].bytes.size());
  write_device(all[1].ptr, fresh.data(), fresh.size());
  EXPECT_TRUE(host_copy(all[1].ptr, snapshot.size()) == snapshot);
  void* host = nullptr;
  std::size_t n = 0;
  EXPECT_EQ(tagmem_host_view(all[1].ptr, TAGMEM_HOST_VIEW_WRITABLE, &host, &n),
            TAGMEM_ERROR_TAG_RESIDENT);

  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  EXPECT_TRUE(host_copy(all[1].ptr, fresh.size()) == fresh);
  TAGMEM_OK(tagmem_set_keep_backup("w", 0, 0));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_TRUE(read_device(all[1].ptr, fresh.size()) == fresh);
  EXPECT_EQ(host_bytes_of("w"), 0u) << "a reload without the flag kept the backup";
  EXPECT_EQ(view_status(all[0].ptr), TAGMEM_ERROR_TAG_RESIDENT);
}

TEST_F(KeepBackup, TurningTheFlagOffKeepsTheCopyUntilTheNextReload) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, 1 << 20);
  keeping_cycle("w");
  TAGMEM_OK(tagmem_set_keep_backup("w", 0, 0));
  EXPECT_TRUE(host_copy(all[0].ptr, all[0].bytes.size()) == all[0].bytes);
  // Offload and reload cycles neither lose bytes nor grow the host copy.
  const std::size_t kept = host_bytes_of("w");
  for (int i = 0; i < 3; ++i) {
    keeping_cycle("w");
    EXPECT_EQ(host_bytes_of("w"), kept);
  }
  EXPECT_EQ(corrupted(all), 0u);
}

// Callers hold on to the host address of a kept copy (torch_memory_saver's retained CPU backup):
// the next offload writes its fresh copy over the kept one, even when free pinned memory lies at
// lower addresses, where a fresh acquire would take it from.
TEST_F(KeepBackup, TheNextOffloadRewritesTheKeptCopyWhereItIs) {
  auto rng = rng_for_test();
  auto below = fill(rng, "below", 2, 2 << 20);
  auto all = fill(rng, "w", 2, 1 << 20);
  const char* below_tags[] = {"below"};
  const char* tags[] = {"w"};
  TAGMEM_OK(tagmem_offload(below_tags, 1, 0, TAGMEM_BACKUP));  // its copy takes the low addresses
  keeping_cycle("w");
  TAGMEM_OK(tagmem_reload(below_tags, 1, 0));  // and gives them back: free, below the kept copy
  void* kept = nullptr;
  std::size_t n = 0;
  TAGMEM_OK(tagmem_host_view(all[0].ptr, 0, &kept, &n));

  for (auto& a : all) {
    a.bytes = random_bytes(rng, a.bytes.size());
    write_device(a.ptr, a.bytes.data(), a.bytes.size());
  }
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  void* again = nullptr;
  TAGMEM_OK(tagmem_host_view(all[0].ptr, 0, &again, &n));
  EXPECT_EQ(again, kept) << "the fresh copy moved away from the kept one";
  for (const auto& a : all) EXPECT_TRUE(host_copy(a.ptr, a.bytes.size()) == a.bytes);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(all), 0u);
  EXPECT_EQ(corrupted(below), 0u);
}

TEST_F(KeepBackup, AnAllocationOrFreeInTheTagRetiresTheKeptCopy) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, 1 << 20);
  keeping_cycle("w");
  ASSERT_TRUE(host_copy(all[0].ptr, all[0].bytes.size()) == all[0].bytes);
  TAGMEM_OK(tagmem_free(all[1].ptr, nullptr));  // also gives the copy back at once
  EXPECT_EQ(view_status(all[0].ptr), TAGMEM_ERROR_TAG_RESIDENT);
  EXPECT_EQ(host_bytes_of("w"), 0u);
  all.pop_back();
  keeping_cycle("w");  // a fresh copy of what is there now
  EXPECT_TRUE(host_copy(all[0].ptr, all[0].bytes.size()) == all[0].bytes);
  auto more = fill(rng, "w", 1, 4096);
  EXPECT_EQ(view_status(all[0].ptr), TAGMEM_ERROR_TAG_RESIDENT);
  EXPECT_NE(std::strstr(tagmem_last_error(), "allocated or freed"), nullptr) << tagmem_last_error();
  EXPECT_EQ(corrupted(all), 0u);
  free_all(more);
}

TEST_F(KeepBackup, DiscardOffloadsKeepNothingAndUnknownTagsAreRefused) {
  auto rng = rng_for_test();
  auto all = fill(rng, "kv", 1, 1 << 20);
  keeping_cycle("kv", TAGMEM_DISCARD);
  EXPECT_EQ(view_status(all[0].ptr), TAGMEM_ERROR_TAG_RESIDENT);
  EXPECT_EQ(host_bytes_of("kv"), 0u);
  EXPECT_EQ(tagmem_set_keep_backup("never-made", 0, 1), TAGMEM_ERROR_UNKNOWN_TAG);
}

// A host store of 16 MiB (TAGMEM_HOST_MAX_BYTES), grown 2 MiB at a time.
class KeepBackupBudget : public tagmem_test {
 protected:
  scoped_env max_{"TAGMEM_HOST_MAX_BYTES", "16M"};
  scoped_env slab_{"TAGMEM_HOST_SLAB_BYTES", "2M"};
};

// Note [kept backup until planned]: an offload that fails for want of host memory leaves a kept
// backup kept and readable; one that fits only by reusing the kept backup's memory still fits.
TEST_F(KeepBackupBudget, AnOffloadBeyondTheBudgetKeepsTheKeptBackup) {
  constexpr std::size_t MiB = 1u << 20;
  auto rng = rng_for_test();
  // Allocations this large get a mapping of their own size: a tag's backup is their sum.
  auto w = fill(rng, "w", 1, 12 * MiB);
  auto big = fill(rng, "big", 1, 12 * MiB);
  keeping_cycle("w");  // 12 MiB of the 16 held by the kept copy
  const auto snapshot = w[0].bytes;
  refill(rng, w);  // the device moves on; the kept copy is the snapshot

  const char* both[] = {"w", "big"};  // 24 MiB: more than the store may hold
  TAGMEM_FAILS_WITH(tagmem_offload(both, 2, 0, TAGMEM_BACKUP), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_EQ(state_of("w"), TAGMEM_RESIDENT);
  EXPECT_EQ(state_of("big"), TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_EQ(corrupted(big), 0u);
  EXPECT_TRUE(host_copy(w[0].ptr, snapshot.size()) == snapshot) << "the kept backup was lost";
  EXPECT_EQ(host_bytes_of("w"), 12 * MiB);

  // 12 MiB kept plus 12 MiB fresh do not fit, but the fresh copy takes the kept one's place.
  const char* one[] = {"w"};
  TAGMEM_OK(tagmem_offload(one, 1, 0, TAGMEM_BACKUP));
  EXPECT_TRUE(host_copy(w[0].ptr, w[0].bytes.size()) == w[0].bytes);
  TAGMEM_OK(tagmem_reload(one, 1, 0));
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_TRUE(host_copy(w[0].ptr, w[0].bytes.size()) == w[0].bytes);
}

// Whether `host` lies in pinned host memory, as the driver answers (cuMemHostGetFlags).
bool pinned(const void* host) {
  use_primary_context();
  unsigned flags = 0;
  return driver_api_for_tests().cuMemHostGetFlags(&flags, const_cast<void*>(host)) == CUDA_SUCCESS;
}

const void* host_of(const void* ptr) {
  void* host = nullptr;
  std::size_t n = 0;
  return tagmem_host_view(ptr, 0, &host, &n) == TAGMEM_SUCCESS ? host : nullptr;
}

// Note [a freed allocation's host copy]: a free gives the allocation's host copy back at once,
// from an offloaded tag (the rest of its backup reloads intact) and from a resident tag's kept
// copy; a slab left empty is unpinned, so the address handed out is no longer pinned memory.
TEST_F(KeepBackup, AFreedAllocationsHostCopyGoesBackAndIsUnpinnedWithItsSlab) {
  auto rng = rng_for_test();
  const char* tags[] = {"f"};
  auto two = fill(rng, "f", 2, (2 << 20) + 4096);  // one segment: the free cuts a piece in two
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  const void* first = host_of(two[0].ptr);
  ASSERT_NE(first, nullptr) << tagmem_last_error();
  const std::size_t before = host_bytes_of("f");
  TAGMEM_OK(tagmem_free(two[0].ptr, nullptr));
  EXPECT_LT(host_bytes_of("f"), before) << "the freed allocation's copy was kept";
  EXPECT_TRUE(pinned(first)) << "its slab still holds the other allocation's copy";
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  std::vector<filled> rest{two[1]};
  EXPECT_EQ(corrupted(rest), 0u);

  keeping_cycle("f");  // a kept copy, freed while the tag is resident
  const void* kept = host_of(rest[0].ptr);
  ASSERT_NE(kept, nullptr) << tagmem_last_error();
  ASSERT_TRUE(pinned(kept));
  TAGMEM_OK(tagmem_free(rest[0].ptr, nullptr));
  EXPECT_EQ(host_bytes_of("f"), 0u);
  EXPECT_FALSE(pinned(kept)) << "the kept copy's slab held nothing else";

  // Freed while paused, in a tag of its own.
  const char* own[] = {"p"};
  auto one = fill(rng, "p", 1, 4096);
  TAGMEM_OK(tagmem_offload(own, 1, 0, TAGMEM_BACKUP));
  const void* paused = host_of(one[0].ptr);
  ASSERT_NE(paused, nullptr) << tagmem_last_error();
  ASSERT_TRUE(pinned(paused));
  TAGMEM_OK(tagmem_free(one[0].ptr, nullptr));
  EXPECT_FALSE(pinned(paused));
  TAGMEM_OK(tagmem_reload(own, 1, 0));
  auto again = fill(rng, "p", 2, 4096);  // the store pins afresh for the next backup
  TAGMEM_OK(tagmem_offload(own, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(own, 1, 0));
  EXPECT_EQ(corrupted(again), 0u);
  free_all(again);
}

// A paused tag's backup also holds the bytes of segments that no live allocation uses (an
// offload copies whole mappings): a probe freed before the pause, as PyTorch's pools leave them.
// Freeing the tag's last allocation gives all of it back, so its address is no longer pinned.
TEST_F(KeepBackup, AFreeWhilePausedGivesBackTheCopiesOfSegmentsWithoutALiveAllocation) {
  auto rng = rng_for_test();
  const char* tags[] = {"q"};
  auto probe = fill(rng, "q", 1, 512);  // a small segment of its own, then cached
  free_all(probe);
  auto two = fill(rng, "q", 2, (2 << 20) + 4096);  // one large segment
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  const void* first = host_of(two[0].ptr);
  ASSERT_NE(first, nullptr) << tagmem_last_error();
  ASSERT_TRUE(pinned(first));
  TAGMEM_OK(tagmem_free(two[0].ptr, nullptr));
  EXPECT_TRUE(pinned(first)) << "its slab still holds the other allocation's copy";
  TAGMEM_OK(tagmem_free(two[1].ptr, nullptr));
  EXPECT_EQ(host_bytes_of("q"), 0u) << "copies of memory no allocation uses were kept";
  EXPECT_FALSE(pinned(first));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  auto again = fill(rng, "q", 2, 4096);  // the tag works on after it
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(again), 0u);
  free_all(again);
}

std::size_t store_pinned() {
  tagmem_device_stats s{};
  EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.host_pinned_bytes;
}

// Note [backups given back to the system]: tagmem_set_unpin_backup makes a reload give that tag's
// host memory back to the system, in an offload and reload beside a tag that keeps its store
// pinned: the other tag's slabs stay pinned and serve its next offload without pinning.
TEST_F(KeepBackup, AnUnpinningTagGivesItsHostMemoryBackAndTheOthersKeepTheirs) {
  auto rng = rng_for_test();
  constexpr std::size_t kBytes = 8u << 20;
  auto kept = fill(rng, "stays", 1, kBytes);
  auto given = fill(rng, "goes", 1, kBytes);
  TAGMEM_OK(tagmem_set_unpin_backup("goes", 0, 1));
  tagmem_tag_stats goes_stats{};
  TAGMEM_OK(tagmem_tag_stats_get("goes", 0, &goes_stats));
  const std::size_t backup = goes_stats.mapped_bytes;  // an offload copies whole mappings
  const char* both[] = {"stays", "goes"};
  TAGMEM_OK(tagmem_offload(both, 2, 0, TAGMEM_BACKUP));  // one batch: both kinds of host memory
  const std::size_t offloaded = store_pinned();
  const void* old = host_of(given[0].ptr);
  ASSERT_NE(old, nullptr) << tagmem_last_error();
  ASSERT_TRUE(pinned(old));
  TAGMEM_OK(tagmem_reload(both, 2, 0));
  EXPECT_EQ(corrupted(kept), 0u);
  EXPECT_EQ(corrupted(given), 0u);
  EXPECT_FALSE(pinned(old)) << "the unpinning tag's host memory is still pinned";
  EXPECT_EQ(store_pinned(), offloaded - backup) << "more or less than its backup went back";
  const std::size_t after = store_pinned();

  refill(rng, kept);
  refill(rng, given);
  const char* stays[] = {"stays"};
  TAGMEM_OK(tagmem_offload(stays, 1, 0, TAGMEM_BACKUP));
  EXPECT_EQ(store_pinned(), after) << "the other tag's offload pinned again";
  TAGMEM_OK(tagmem_reload(stays, 1, 0));
  TAGMEM_OK(tagmem_offload(both, 2, 0, TAGMEM_BACKUP));
  EXPECT_EQ(store_pinned(), offloaded) << "the unpinning tag's next offload pins its size again";
  TAGMEM_OK(tagmem_reload(both, 2, 0));
  EXPECT_EQ(corrupted(kept), 0u);
  EXPECT_EQ(corrupted(given), 0u);
  EXPECT_EQ(store_pinned(), after);

  // Keeping the backup wins: the copy stays, pinned and readable, until the next reload.
  const char* goes[] = {"goes"};
  keeping_cycle("goes");
  const void* view = host_of(given[0].ptr);
  ASSERT_NE(view, nullptr) << tagmem_last_error();
  EXPECT_TRUE(pinned(view));
  EXPECT_TRUE(host_copy(given[0].ptr, kBytes) == given[0].bytes);
  TAGMEM_OK(tagmem_set_keep_backup("goes", 0, 0));
  TAGMEM_OK(tagmem_offload(goes, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(goes, 1, 0));
  EXPECT_EQ(corrupted(given), 0u);
  EXPECT_EQ(tagmem_set_unpin_backup("no_such_tag", 0, 1), TAGMEM_ERROR_UNKNOWN_TAG);
  free_all(kept);
  free_all(given);
}

// The flag changed between the offload and the reload. Cleared: the backup already lies in slabs
// of its own, which serve no other tag, so they go back at the reload rather than stay pinned
// until a trim. Set: the backup lies in the shared slabs, which stay pinned for the next offload.
TEST_F(KeepBackup, AnUnpinFlagChangedWhileOffloadedFollowsWhereTheBackupLies) {
  auto rng = rng_for_test();
  constexpr std::size_t kBytes = 8u << 20;
  auto data = fill(rng, "flips", 1, kBytes);
  const char* flips[] = {"flips"};
  const std::size_t before = store_pinned();

  TAGMEM_OK(tagmem_set_unpin_backup("flips", 0, 1));
  TAGMEM_OK(tagmem_offload(flips, 1, 0, TAGMEM_BACKUP));
  const void* old = host_of(data[0].ptr);
  ASSERT_NE(old, nullptr) << tagmem_last_error();
  TAGMEM_OK(tagmem_set_unpin_backup("flips", 0, 0));
  TAGMEM_OK(tagmem_reload(flips, 1, 0));
  EXPECT_EQ(corrupted(data), 0u);
  EXPECT_FALSE(pinned(old)) << "the backup's own slabs stayed pinned after the reload";
  EXPECT_EQ(store_pinned(), before);

  refill(rng, data);
  TAGMEM_OK(tagmem_offload(flips, 1, 0, TAGMEM_BACKUP));  // into the shared slabs
  const std::size_t offloaded = store_pinned();
  const void* shared = host_of(data[0].ptr);
  ASSERT_NE(shared, nullptr) << tagmem_last_error();
  TAGMEM_OK(tagmem_set_unpin_backup("flips", 0, 1));
  TAGMEM_OK(tagmem_reload(flips, 1, 0));
  EXPECT_EQ(corrupted(data), 0u);
  EXPECT_EQ(store_pinned(), offloaded) << "the shared slabs were unpinned";
  EXPECT_TRUE(pinned(shared));
  free_all(data);
}

class EmulatorKeepBackup : public tagmem_test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    tagmem_test::SetUp();
  }
  void TearDown() override {
    if (emulator().available) emulator().clear_faults();
    tagmem_test::TearDown();
  }
};

// A tag whose offload stopped part way (its release failed, and so did mapping the first part
// back) and that is then reloaded keeping its backup: the kept copy holds only the part that
// left the device. A view of the part that never left it is TAG_RESIDENT, not INTERNAL.
TEST_F(EmulatorKeepBackup, AKeptBackupOfAPartlyOffloadedTagViewsOnlyWhatLeftTheDevice) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 3, 16u << 20);  // a segment each
  const char* tags[] = {"w"};
  TAGMEM_OK(tagmem_set_keep_backup("w", 0, 1));
  ASSERT_EQ(emulator().fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN), 0);
  ASSERT_EQ(emulator().fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN), 0);
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_DRIVER);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("w", 0, &s));
  ASSERT_EQ(s.state, TAGMEM_OFFLOADED_BACKUP);
  ASSERT_EQ(s.mapped_bytes, 32u << 20) << "the offload should have stopped after one segment";
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(all), 0u);
  int viewed = 0;
  for (const filled& a : all) {
    const tagmem_status st = view_status(a.ptr);
    if (st == TAGMEM_SUCCESS) {
      ++viewed;
      EXPECT_TRUE(host_copy(a.ptr, a.bytes.size()) == a.bytes);
    } else {
      EXPECT_EQ(st, TAGMEM_ERROR_TAG_RESIDENT) << tagmem_last_error();
      EXPECT_NE(std::strstr(tagmem_last_error(), "never left the device"), nullptr)
          << tagmem_last_error();
    }
  }
  EXPECT_EQ(viewed, 1);
}

}  // namespace
}  // namespace tagmem::test
