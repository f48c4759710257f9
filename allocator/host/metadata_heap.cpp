// metadata_heap.cpp — mimalloc heaps for tagmem's records (see Note [metadata heap]).
//
// Note [private mimalloc]: Debian's libmimalloc.so.2 is built to override malloc and operator
// new/delete. Linked as a dependency (DT_NEEDED) it would replace the allocator of any process
// that loads tagmem wherever it lands in the global symbol scope, and a library loaded privately
// (Python's ctypes) ends up mixing glibc's operator new with mimalloc's operator delete. So
// tagmem never links it: it opens libmimalloc.so.2 (or TAGMEM_MIMALLOC_LIBRARY) with RTLD_LOCAL,
// whose overriding symbols then stay private, and calls the five functions it needs through
// pointers. Without the library, or with TAGMEM_METADATA=system, records go to malloc.
//
// A mimalloc heap may only allocate from the thread that created it, so each thread gets its own
// private heap on first use; blocks may be freed from any thread. At thread exit the heap is
// deleted, which hands its live blocks to that thread's default mimalloc heap (still mimalloc).
//
// Note [heap at thread exit]: a thread's destructors may call tagmem after its heap is gone: a
// C++ thread_local constructed before the thread's first tagmem call is destroyed after the heap's
// own thread_local, and pthread key destructors run after every thread_local one. Such calls, and
// any call of a thread whose heap cannot be deleted in time, take their records from malloc
// (the header says so, Note [block origin]). The heap is deleted by whichever comes first of a
// thread_local destructor and a pthread key destructor; the key is what catches a heap made by a
// thread's first call from inside a key destructor, where a new thread_local's destructor is
// never run. That key is created before libmimalloc is loaded, so in every round of key
// destructors ours runs before mimalloc's own thread cleanup, which deletes every heap of the
// thread: a heap is never used, or deleted again, after mimalloc has deleted it. Where
// libmimalloc was in the process before tagmem, its key is older than ours and that order cannot
// be had, so records go to malloc (which is then most likely mimalloc's own, preloaded).
//
// Note [block origin]: the allocator may change between a block's allocation and its free
// (shutdown, then init with another TAGMEM_METADATA), so each block says who made it, in a
// header in front of it. Asking mimalloc instead (mi_is_in_heap_region) is wrong for blocks
// outside the address range its segment map covers: where other reservations (CUDA's, tagmem's
// arenas) occupy the range mimalloc asks the kernel for, its segments land above it, and such a
// block was handed to free() — a crash on the first record a new thread freed.
#include "host/metadata_heap.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>

#include "options/options.hpp"

namespace tagmem {
namespace {

struct mi_heap_s;
using mi_heap = mi_heap_s;

struct mimalloc_api {
  mi_heap* (*heap_new)() = nullptr;
  void (*heap_delete)(mi_heap*) = nullptr;
  void* (*heap_malloc)(mi_heap*, std::size_t) = nullptr;
  void (*free)(void*) = nullptr;
};

// The header before each block (Note [block origin]); its size keeps blocks 16-byte aligned, as
// malloc and mimalloc return them.
struct alignas(16) block_header {
  bool from_mimalloc;
};
static_assert(sizeof(block_header) == 16);

std::once_flag g_load_once;
mimalloc_api g_mi;                        // all set, or all null
std::atomic<bool> g_use_mimalloc{false};  // what meta_malloc uses now
pthread_key_t g_heap_key;                 // its destructor deletes the thread's heap

// What a thread has of its heap. Trivially destructible, so it stays readable through every
// destructor of the thread (Note [heap at thread exit]).
struct thread_heap_state {
  mi_heap* heap = nullptr;
  bool gone = false;  // deleted: this thread's records go to malloc from now on
};
constinit thread_local thread_heap_state t_heap;

void retire_heap() noexcept {
  if (t_heap.heap) g_mi.heap_delete(t_heap.heap);
  t_heap.heap = nullptr;
  t_heap.gone = true;
}

void retire_heap_at_key_exit(void*) { retire_heap(); }

void load_mimalloc() {
  // Our key before libmimalloc's own (Note [heap at thread exit]).
  if (dlopen(option_text(option::MIMALLOC_LIBRARY), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return;
  if (pthread_key_create(&g_heap_key, retire_heap_at_key_exit) != 0) return;
  void* h = dlopen(option_text(option::MIMALLOC_LIBRARY), RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  mimalloc_api m;
  m.heap_new = reinterpret_cast<decltype(m.heap_new)>(dlsym(h, "mi_heap_new"));
  m.heap_delete = reinterpret_cast<decltype(m.heap_delete)>(dlsym(h, "mi_heap_delete"));
  m.heap_malloc = reinterpret_cast<decltype(m.heap_malloc)>(dlsym(h, "mi_heap_malloc"));
  m.free = reinterpret_cast<decltype(m.free)>(dlsym(h, "mi_free"));
  if (m.heap_new && m.heap_delete && m.heap_malloc && m.free) {
    g_mi = m;  // the handle stays open for the life of the process
  } else {
    dlclose(h);
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TAGMEM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TAGMEM_SANITIZED 1
#endif
#endif

bool mimalloc_loaded() {
#ifdef TAGMEM_SANITIZED
  // Sanitizer builds keep records in malloc, where the sanitizer sees every block (and mimalloc's
  // address-range test is unreliable beside ASan's shadow memory).
  return false;
#endif
  std::call_once(g_load_once, load_mimalloc);
  return g_mi.heap_new != nullptr;
}

struct heap_retirer {
  ~heap_retirer() { retire_heap(); }
};

// Null where this thread's records go to malloc (its heap is gone, or may not be made now).
mi_heap* my_heap() {
  if (t_heap.heap || t_heap.gone) return t_heap.heap;
  mi_heap* heap = g_mi.heap_new();
  if (!heap) return nullptr;
  if (pthread_setspecific(g_heap_key, heap) != 0) {
    g_mi.heap_delete(heap);
    return nullptr;
  }
  t_heap.heap = heap;
  thread_local heap_retirer retirer;  // deletes it at the thread's thread_local destructors
  (void)retirer;
  return heap;
}

}  // namespace

bool set_metadata_allocator(metadata_allocator which) noexcept {
  bool mi = which == metadata_allocator::mimalloc && mimalloc_loaded();
  g_use_mimalloc.store(mi);
  return mi == (which == metadata_allocator::mimalloc);
}

metadata_allocator current_metadata_allocator() noexcept {
  return g_use_mimalloc.load() ? metadata_allocator::mimalloc : metadata_allocator::system;
}

void* meta_malloc(std::size_t bytes) {
  if (bytes > SIZE_MAX - sizeof(block_header)) throw std::bad_alloc();
  const std::size_t total = bytes + sizeof(block_header);
  mi_heap* heap = g_use_mimalloc.load(std::memory_order_relaxed) ? my_heap() : nullptr;
  const bool mi = heap != nullptr;  // else malloc (Note [heap at thread exit])
  void* p = mi ? g_mi.heap_malloc(heap, total) : std::malloc(total);
  if (!p) throw std::bad_alloc();
  auto* h = new (p) block_header{mi};
  return h + 1;
}

void meta_free(void* p) noexcept {
  if (!p) return;
  auto* h = static_cast<block_header*>(p) - 1;
  if (h->from_mimalloc) {
    g_mi.free(h);
  } else {
    std::free(h);
  }
}

}  // namespace tagmem
