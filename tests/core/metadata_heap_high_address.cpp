// metadata_heap_high_address.cpp — records made by a thread whose mimalloc segments land above
// the address range mimalloc's segment map covers are freed by mimalloc, from any thread
// (Note [block origin] in allocator/host/metadata_heap.cpp).
//
// In a process where CUDA and tagmem's arenas have reserved large virtual ranges, mimalloc's
// preferred addresses are taken and the kernel places its segments high. The program makes that
// happen on purpose: it reserves [1 TiB, 64 TiB) with PROT_NONE before mimalloc's first
// allocation, then a new thread allocates records (random bytes) that the main thread checks
// and frees. Exit 0 when every byte came back and every free went to the right allocator; a
// free handed to the wrong allocator aborts. Exit 77 (skipped) when mimalloc cannot be loaded
// or the range cannot be reserved.
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "host/metadata_heap.hpp"

int main() {
  constexpr std::size_t kTiB = std::size_t(1) << 40;
  void* want = reinterpret_cast<void*>(kTiB);
  void* got = mmap(want, 63 * kTiB, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got != want) {
    std::printf("skipped: [1 TiB, 64 TiB) cannot be reserved here\n");
    return 77;
  }
  if (!tagmem::set_metadata_allocator(tagmem::metadata_allocator::mimalloc)) {
    std::printf("skipped: mimalloc cannot be loaded\n");
    return 77;
  }
  struct record {
    unsigned char* p;
    std::size_t n;
    std::vector<unsigned char> expected;
  };
  std::vector<record> records;
  std::thread maker([&] {
    std::mt19937_64 rng(std::random_device{}());
    for (int i = 0; i < 2000; ++i) {
      std::size_t n = 1 + rng() % 8192;
      record r{static_cast<unsigned char*>(tagmem::meta_malloc(n)), n,
               std::vector<unsigned char>(n)};
      for (auto& b : r.expected) b = static_cast<unsigned char>(rng());
      std::memcpy(r.p, r.expected.data(), n);
      records.push_back(std::move(r));
    }
  });
  maker.join();
  std::size_t high = 0, bad = 0;
  for (record& r : records) {
    if (reinterpret_cast<std::uintptr_t>(r.p) >= 64 * kTiB) ++high;
    if (std::memcmp(r.p, r.expected.data(), r.n) != 0) ++bad;
    tagmem::meta_free(r.p);
  }
  std::printf("%zu records, %zu above 64 TiB, %zu with wrong bytes, all freed\n", records.size(),
              high, bad);
  munmap(got, 63 * kTiB);
  return bad == 0 && high > 0 ? 0 : 1;
}
