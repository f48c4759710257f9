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

TEST_F(KeepBackup, AnAllocationOrFreeInTheTagRetiresTheKeptCopy) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, 1 << 20);
  keeping_cycle("w");
  ASSERT_TRUE(host_copy(all[0].ptr, all[0].bytes.size()) == all[0].bytes);
  TAGMEM_OK(tagmem_free(all[1].ptr, nullptr));
  EXPECT_EQ(view_status(all[0].ptr), TAGMEM_ERROR_TAG_RESIDENT);
  EXPECT_NE(std::strstr(tagmem_last_error(), "allocated or freed"), nullptr) << tagmem_last_error();
  all.pop_back();
  keeping_cycle("w");  // a fresh copy of what is there now
  EXPECT_TRUE(host_copy(all[0].ptr, all[0].bytes.size()) == all[0].bytes);
  EXPECT_EQ(corrupted(all), 0u);
}

TEST_F(KeepBackup, DiscardOffloadsKeepNothingAndUnknownTagsAreRefused) {
  auto rng = rng_for_test();
  auto all = fill(rng, "kv", 1, 1 << 20);
  keeping_cycle("kv", TAGMEM_DISCARD);
  EXPECT_EQ(view_status(all[0].ptr), TAGMEM_ERROR_TAG_RESIDENT);
  EXPECT_EQ(host_bytes_of("kv"), 0u);
  EXPECT_EQ(tagmem_set_keep_backup("never-made", 0, 1), TAGMEM_ERROR_UNKNOWN_TAG);
}

}  // namespace
}  // namespace tagmem::test
