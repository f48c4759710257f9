// address_space.cpp — reservations and regions in two ordered maps keyed by base address.
//
// Ranges never overlap within a map, so the one containing an address is the last whose base is
// not above it. Walking contiguous regions from there answers every range question; a range
// spans few regions (copies move at most copy_piece bytes at a time), so walks are short.
// All functions expect the global lock (Note [emu locking]).
#include "address_space.hpp"

#include <condition_variable>
#include <map>
#include <type_traits>

namespace tagmem::emu {
namespace {

struct tables {
  std::map<uintptr_t, size_t> reservations;  // base -> size
  std::map<uintptr_t, region> regions;       // base -> region
  std::condition_variable unpinned;          // signalled when a pin count drops to zero
};

tables& t() {
  static tables* instance = new tables;  // leaked: see Note [emu locking]
  return *instance;
}

template <class Map>
auto containing(Map& map, uintptr_t addr) {
  auto it = map.upper_bound(addr);
  if (it == map.begin()) return map.end();
  --it;
  const size_t size = [&] {
    if constexpr (std::is_same_v<typename Map::mapped_type, size_t>)
      return it->second;
    else
      return it->second.size;
  }();
  return addr < it->first + size ? it : map.end();
}

// Calls f(region&) for the contiguous regions covering [addr, addr+size); false if one is
// missing or f returns false.
template <class F>
bool walk(uintptr_t addr, size_t size, F&& f) {
  const uintptr_t end = addr + size;
  if (end < addr) return false;
  auto it = containing(t().regions, addr);
  for (uintptr_t at = addr; at < end; ++it) {
    if (it == t().regions.end() || it->first > at) return false;
    if (!f(it->second)) return false;
    at = it->first + it->second.size;
  }
  return true;
}

bool allows(const region& r, int device, bool write) {
  const uint64_t bit = uint64_t{1} << device;
  return ((write ? r.writers : r.readers) & bit) != 0;
}

}  // namespace

void add_reservation(lock&, uintptr_t base, size_t size) { t().reservations[base] = size; }

size_t reservation_at(lock&, uintptr_t base) {
  auto it = t().reservations.find(base);
  return it == t().reservations.end() ? 0 : it->second;
}

void remove_reservation(lock&, uintptr_t base) { t().reservations.erase(base); }

bool inside_one_reservation(lock&, uintptr_t base, size_t size) {
  auto it = containing(t().reservations, base);
  return it != t().reservations.end() && base + size <= it->first + it->second;
}

region& add_region(lock&, region r) {
  const uintptr_t base = r.base;
  return t().regions.emplace(base, std::move(r)).first->second;
}

void remove_region(lock&, uintptr_t base) { t().regions.erase(base); }

region* region_at(lock&, uintptr_t addr) {
  auto it = containing(t().regions, addr);
  return it == t().regions.end() ? nullptr : &it->second;
}

bool any_region_in(lock&, uintptr_t base, size_t size) {
  auto it = t().regions.lower_bound(base);
  if (it != t().regions.end() && it->first < base + size) return true;
  return containing(t().regions, base) != t().regions.end();
}

std::vector<region*> whole_mappings(lock&, uintptr_t base, size_t size) {
  std::vector<region*> found;
  const uintptr_t end = base + size;
  if (size == 0 || end < base) return found;
  auto it = t().regions.find(base);
  for (uintptr_t at = base; at < end; ++it) {
    if (it == t().regions.end() || it->first != at) return {};
    region& r = it->second;
    if (r.kind != region_kind::mapping || r.size > end - at) return {};
    found.push_back(&r);
    at += r.size;
  }
  return found;
}

bool accessible(lock&, uintptr_t addr, size_t size, int device, bool write) {
  return walk(addr, size, [&](region& r) { return allows(r, device, write); });
}

bool pin(lock& held, uintptr_t addr, size_t size, int device, bool write) {
  if (!accessible(held, addr, size, device, write)) return false;
  walk(addr, size, [](region& r) { return ++r.pins, true; });
  return true;
}

void unpin(lock&, uintptr_t addr, size_t size) {
  bool released = false;
  walk(addr, size, [&](region& r) {
    if (--r.pins == 0) released = true;
    return true;
  });
  if (released) t().unpinned.notify_all();
}

bool any_pinned(lock&, uintptr_t base, size_t size) {
  auto it = containing(t().regions, base);
  if (it == t().regions.end()) it = t().regions.lower_bound(base);
  for (; it != t().regions.end() && it->first < base + size; ++it)
    if (it->second.pins > 0) return true;
  return false;
}

void wait_unpinned(lock& held, uintptr_t base, size_t size) {
  t().unpinned.wait(held, [&] { return !any_pinned(held, base, size); });
}

}  // namespace tagmem::emu
