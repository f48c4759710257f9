// metadata_heap.cpp — mimalloc heaps for tagmem's records (see Note [metadata heap]).
//
// A mimalloc heap may only allocate from the thread that created it, so each thread gets its own
// private heap on first use; blocks may be freed from any thread. At thread exit the heap is
// deleted, which hands its live blocks to that thread's default mimalloc heap (still mimalloc).
#include "metadata_heap.hpp"

#include <mimalloc.h>

#include <atomic>
#include <cstdlib>

namespace tagmem {
namespace {

std::atomic<metadata_allocator> g_which{metadata_allocator::mimalloc};

struct thread_heap {
  mi_heap_t* heap = nullptr;
  ~thread_heap() {
    if (heap) mi_heap_delete(heap);
  }
};

mi_heap_t* my_heap() {
  thread_local thread_heap h;
  if (!h.heap) h.heap = mi_heap_new();
  return h.heap;
}

}  // namespace

void set_metadata_allocator(metadata_allocator which) noexcept { g_which.store(which); }

void* meta_malloc(std::size_t bytes) {
  void* p = g_which.load(std::memory_order_relaxed) == metadata_allocator::mimalloc
                ? mi_heap_malloc(my_heap(), bytes)
                : std::malloc(bytes);
  if (!p) throw std::bad_alloc();
  return p;
}

void meta_free(void* p) noexcept {
  if (!p) return;
  if (mi_is_in_heap_region(p)) {
    mi_free(p);
  } else {
    std::free(p);
  }
}

}  // namespace tagmem
