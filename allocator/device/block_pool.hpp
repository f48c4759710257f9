// block_pool.hpp — the caching sub-allocator of one tag.
//
// Requests are rounded to 256 bytes and served from segments: virtual ranges of the tag's arena
// backed by physical memory. Small requests (<= 1 MiB) share chunk_bytes segments, medium ones
// (<= 10 MiB) share large_segment_bytes segments, larger ones get a segment of their own rounded
// to the granularity. A segment is split into blocks; freed blocks stay cached, merge with free
// neighbours and are reused best-fit.
//
// Note [stream-ordered reuse]: a block freed on stream S may be handed out again at once for
// stream S (its old work and new work are ordered by S). Handing it to another stream T needs T
// to wait for everything S had queued when the block was freed; since the free happened before
// the reuse, an event recorded on S at reuse time covers that work, so reuse records one and
// makes T wait on it. An allocation for the NULL (or legacy) stream promises memory usable on any
// stream, as cudaMalloc's is, so it waits on the host instead. One handle names no single stream:
// CU_STREAM_PER_THREAD is each thread's own, so a free on it records its event at once, in the
// freeing thread, and no later allocation counts as the same stream (it waits on that event);
// and a block taken for CU_STREAM_PER_THREAD leaves any remainder split off it with the stream
// and event it had, not with a handle that means another stream in the next thread. Blocks of
// different streams never merge, nor do blocks that hold such an event.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "device/vm_arena.hpp"
#include "host/metadata_heap.hpp"

namespace tagmem {

struct segment;

struct block : meta_object {
  CUdeviceptr ptr = 0;
  std::size_t size = 0;       // bytes of the block (multiple of 256)
  std::size_t requested = 0;  // what the caller asked for, while allocated
  CUstream stream = nullptr;  // the stream that may reuse it at once
  CUevent freed = nullptr;    // recorded at a free on CU_STREAM_PER_THREAD, while cached
  bool allocated = false;
  bool held = false;  // freed, but neither cached nor merged until released (block_pool::hold)
  segment* seg = nullptr;
  block* prev = nullptr;  // neighbours inside the segment, by address
  block* next = nullptr;
};

struct segment : meta_object {
  CUdeviceptr base = 0;
  std::size_t size = 0;
  bool small = false;    // serves small requests
  std::size_t live = 0;  // allocated blocks in it
  block* first = nullptr;
};

// The device range [first, first + second) that holds no live block once `b` is freed: `b` with
// the free blocks next to it in its segment (whatever stream they are cached for).
inline std::pair<CUdeviceptr, std::size_t> free_span_around(const block& b) noexcept {
  const block* first = &b;
  while (first->prev && !first->prev->allocated && !first->prev->held) first = first->prev;
  const block* last = &b;
  while (last->next && !last->next->allocated && !last->next->held) last = last->next;
  return {first->ptr, std::size_t(last->ptr + last->size - first->ptr)};
}

struct pool_totals {
  std::size_t allocated_bytes = 0;
  std::size_t requested_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::uint64_t live_allocations = 0;
};

class block_pool {
 public:
  block_pool(vm_arena& arena, const config& cfg);
  ~block_pool();  // frees the records only; the arena releases the memory
  block_pool(const block_pool&) = delete;
  block_pool& operator=(const block_pool&) = delete;

  static constexpr std::size_t alignment = 256;
  static constexpr std::size_t small_limit = 1u << 20;
  static constexpr std::size_t medium_limit = 10u << 20;

  // Returns a block of at least `size` bytes usable on `stream`. Throws OUT_OF_MEMORY / DRIVER
  // with nothing changed.
  block* allocate(std::size_t size, CUstream stream);
  // The allocated block containing `address`, or nullptr.
  block* find_containing(CUdeviceptr address) const;
  // Returns the live block starting at `ptr` to the cache, reusable at once by `stream`; false
  // (nothing changed) when no live block starts there. Throws DRIVER with nothing changed.
  bool free(CUdeviceptr ptr, CUstream stream);
  // Frees the live block starting at `ptr` as free() does (its stream ordering and the totals),
  // but keeps it out of the cache, and its segment in use, until release_held(ptr): another
  // process still maps its memory. False (nothing changed) when no live block starts there.
  // Throws DRIVER with nothing changed.
  bool hold(CUdeviceptr ptr, CUstream stream);
  // Caches a block that hold() kept; false when none starts at `ptr`.
  bool release_held(CUdeviceptr ptr);
  // Releases the physical memory and virtual space of every mapping whose segments hold no live
  // block. Returns the bytes released. Only valid while every mapping is resident.
  std::size_t release_cached();
  // Whether release_cached() would give anything back to the driver.
  bool has_releasable() const;
  // Appends the allocated blocks' ranges (address, bytes), by address.
  void live_ranges(meta_vector<std::pair<CUdeviceptr, std::size_t>>& out) const;
  // Appends the ranges (base, bytes) of the segments that hold no live block, by address.
  void unused_segments(meta_vector<std::pair<CUdeviceptr, std::size_t>>& out) const;

  const pool_totals& totals() const noexcept { return totals_; }

 private:
  // Cached blocks of one stream, best fit first: by size, then by address. Looked up by size.
  struct by_size {
    using is_transparent = void;
    bool operator()(const block* a, const block* b) const;
    bool operator()(const block* a, std::size_t size) const { return a->size < size; }
    bool operator()(std::size_t size, const block* b) const { return size < b->size; }
  };
  using free_list = meta_set<block*, by_size>;
  // One free list per stream that may reuse its blocks at once, as RMM keeps them. A list that
  // empties stays (its stream is likely to free again soon) until a search of the other streams
  // passes it, so the lists stay as many as the streams that use the pool.
  using free_lists = meta_map<CUstream, free_list>;

  free_lists& lists_for(const segment* s) noexcept { return s->small ? free_small_ : free_large_; }
  void cache(block* b);
  void uncache(block* b);
  block* take_free(std::size_t size, CUstream stream, bool small);
  void order_reuse(const block* b, CUstream stream);
  void forget_event(block* b) noexcept;
  block* new_segment(std::size_t size, bool small);
  block* split(block* b, std::size_t size);
  void merge_free(block* b);
  void erase_segment(segment* s);
  // Takes the live block at `ptr` out of the live set as a free does; nullptr when none.
  block* retire(CUdeviceptr ptr, CUstream stream);

  vm_arena& arena_;
  const config& cfg_;
  free_lists free_small_, free_large_;
  meta_unordered_map<CUdeviceptr, block*> live_;
  meta_unordered_map<CUdeviceptr, block*> held_;
  meta_map<CUdeviceptr, segment*> segments_;  // by base
  pool_totals totals_;
};

}  // namespace tagmem
