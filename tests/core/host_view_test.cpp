// host_view_test.cpp — tagmem_host_view(): an offloaded allocation's bytes read (and written) in
// the pinned host store, piece by piece, and the errors for everything that has no such bytes.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class HostView : public tagmem_test {};

// The allocation's bytes as the host views give them, walking piece by piece from `ptr` for
// `size` bytes; `calls` counts the views needed.
std::vector<unsigned char> read_views(const void* ptr, std::size_t size, int* calls) {
  std::vector<unsigned char> out;
  *calls = 0;
  while (out.size() < size) {
    void* host = nullptr;
    std::size_t n = 0;
    auto at = static_cast<const char*>(ptr) + out.size();
    tagmem_status s = tagmem_host_view(at, 0, &host, &n);
    EXPECT_EQ(s, TAGMEM_SUCCESS) << tagmem_last_error();
    if (s != TAGMEM_SUCCESS || n == 0 || n > size - out.size()) {
      ADD_FAILURE() << "view of " << n << " bytes with " << size - out.size() << " left";
      break;
    }
    auto* h = static_cast<const unsigned char*>(host);
    out.insert(out.end(), h, h + n);
    ++*calls;
  }
  return out;
}

TEST_F(HostView, BackupBytesAreReadableOnTheHostFromAnyInteriorAddress) {
  auto rng = rng_for_test();
  auto small = fill(rng, "weights", 50, 12345);
  auto big = fill(rng, "weights", 2, 9 << 20);
  const char* tags[] = {"weights"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  for (const auto* group : {&small, &big}) {
    for (const auto& a : *group) {
      int calls = 0;
      EXPECT_TRUE(read_views(a.ptr, a.bytes.size(), &calls) == a.bytes);
      std::size_t offset = rng() % a.bytes.size();
      auto tail = read_views(static_cast<char*>(a.ptr) + offset, a.bytes.size() - offset, &calls);
      EXPECT_TRUE(std::equal(tail.begin(), tail.end(), a.bytes.begin() + offset));
    }
  }
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(small) + corrupted(big), 0u);
}

TEST_F(HostView, AnAllocationInSeveralHostPiecesIsWalkedPieceByPiece) {
  // One-MiB slabs and copy pieces: a 6 MiB allocation cannot sit in one host range unless slabs
  // happened to be pinned back to back, which the walk handles the same way.
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  setenv("TAGMEM_HOST_SLAB_BYTES", "1MiB", 1);
  tagmem_config cfg;
  tagmem_config_init(&cfg);
  cfg.copy_piece_bytes = 1 << 20;
  tagmem_status s = tagmem_init(&cfg);
  unsetenv("TAGMEM_HOST_SLAB_BYTES");
  TAGMEM_OK(s);
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 3, (6 << 20) + 777);
  const char* tags[] = {"w"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  int most_calls = 0;
  for (const auto& a : all) {
    int calls = 0;
    EXPECT_TRUE(read_views(a.ptr, a.bytes.size(), &calls) == a.bytes);
    most_calls = std::max(most_calls, calls);
  }
  EXPECT_GT(most_calls, 1) << "every allocation came back in one view: the piece walk is untested";
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(all), 0u);
}

TEST_F(HostView, WritesThroughAWritableViewAreWhatTheReloadRestores) {
  auto rng = rng_for_test();
  auto all = fill(rng, "weights", 8, 3 << 20);
  const char* tags[] = {"weights"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  for (auto& a : all) {
    a.bytes = random_bytes(rng, a.bytes.size());
    for (std::size_t done = 0; done < a.bytes.size();) {
      void* host = nullptr;
      std::size_t n = 0;
      TAGMEM_OK(
          tagmem_host_view(static_cast<char*>(a.ptr) + done, TAGMEM_HOST_VIEW_WRITABLE, &host, &n));
      ASSERT_GT(n, 0u);
      std::memcpy(host, a.bytes.data() + done, n);
      done += n;
    }
  }
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(all), 0u);
}

TEST_F(HostView, TagsWithoutHostBytesAndForeignPointersAreErrors) {
  auto rng = rng_for_test();
  auto kept = fill(rng, "weights", 2, 4096);
  auto dropped = fill(rng, "kv", 2, 4096);
  void* host = reinterpret_cast<void*>(0x1);
  std::size_t n = 12345;
  TAGMEM_FAILS_WITH(tagmem_host_view(kept[0].ptr, 0, &host, &n), TAGMEM_ERROR_TAG_RESIDENT);
  const char* w[] = {"weights"};
  const char* kv[] = {"kv"};
  TAGMEM_OK(tagmem_offload(w, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_offload(kv, 1, 0, TAGMEM_DISCARD));
  TAGMEM_FAILS_WITH(tagmem_host_view(dropped[0].ptr, 0, &host, &n), TAGMEM_ERROR_TAG_OFFLOADED);
  int on_stack = 0;
  TAGMEM_FAILS_WITH(tagmem_host_view(&on_stack, 0, &host, &n), TAGMEM_ERROR_UNKNOWN_POINTER);
  TAGMEM_FAILS_WITH(tagmem_host_view(static_cast<char*>(kept[1].ptr) + 4096, 0, &host, &n),
                    TAGMEM_ERROR_UNKNOWN_POINTER);  // past the requested size
  TAGMEM_FAILS_WITH(tagmem_host_view(kept[0].ptr, 2, &host, &n), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_host_view(kept[0].ptr, 0, nullptr, &n), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_host_view(kept[0].ptr, 0, &host, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(host, reinterpret_cast<void*>(0x1));  // failures leave the outputs alone
  EXPECT_EQ(n, 12345u);
  TAGMEM_OK(tagmem_free(kept[1].ptr, nullptr));  // freed while offloaded: no longer viewable
  TAGMEM_FAILS_WITH(tagmem_host_view(kept[1].ptr, 0, &host, &n), TAGMEM_ERROR_UNKNOWN_POINTER);
  TAGMEM_OK(tagmem_reload(w, 1, 0));
  TAGMEM_FAILS_WITH(tagmem_host_view(kept[0].ptr, 0, &host, &n), TAGMEM_ERROR_TAG_RESIDENT);
  std::vector<filled> still{kept[0]};
  EXPECT_EQ(corrupted(still), 0u);
}

}  // namespace
}  // namespace tagmem::test
