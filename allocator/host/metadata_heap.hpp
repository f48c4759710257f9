// metadata_heap.hpp — where tagmem's own bookkeeping lives.
//
// Note [metadata heap]: tagmem's maps, blocks and segment records are allocated from mimalloc,
// one private mi_heap per thread, never from the application's malloc (loaded privately, see
// Note [private mimalloc] in metadata_heap.cpp): inside an LD_PRELOADed
// process the application may be using malloc in odd states (a fork, a signal handler's caller,
// its own interposed malloc), and keeping our records apart avoids both interference and
// fragmentation of its heap. TAGMEM_METADATA=system switches to malloc (for the benchmark that
// decides whether mimalloc pays). The choice is fixed at init; meta_free() frees either kind.
#pragma once

#include <cstddef>
#include <map>
#include <new>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "options/config.hpp"

namespace tagmem {

// Chooses the allocator for records made from now on; false when mimalloc was asked for but
// libmimalloc.so.2 cannot be loaded (records then go to malloc).
bool set_metadata_allocator(metadata_allocator which) noexcept;
// The allocator records go to now (mimalloc only when it was asked for and loaded).
metadata_allocator current_metadata_allocator() noexcept;
void* meta_malloc(std::size_t bytes);  // throws std::bad_alloc
void meta_free(void* p) noexcept;

template <class T>
struct meta_allocator {
  using value_type = T;
  meta_allocator() noexcept = default;
  template <class U>
  meta_allocator(const meta_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(meta_malloc(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { meta_free(p); }
  template <class U>
  bool operator==(const meta_allocator<U>&) const noexcept {
    return true;
  }
};

// Gives a class operator new/delete on the metadata heap.
struct meta_object {
  static void* operator new(std::size_t n) { return meta_malloc(n); }
  static void operator delete(void* p) noexcept { meta_free(p); }
};

template <class T>
using meta_vector = std::vector<T, meta_allocator<T>>;
template <class K, class V, class C = std::less<K>>
using meta_map = std::map<K, V, C, meta_allocator<std::pair<const K, V>>>;
template <class K, class C = std::less<K>>
using meta_set = std::set<K, C, meta_allocator<K>>;
template <class K, class V>
using meta_unordered_map =
    std::unordered_map<K, V, std::hash<K>, std::equal_to<K>, meta_allocator<std::pair<const K, V>>>;
using meta_string = std::basic_string<char, std::char_traits<char>, meta_allocator<char>>;

}  // namespace tagmem
