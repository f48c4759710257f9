// model.hpp — the reference model of the state-machine fuzzer, and its comparison with tagmem.
//
// The model knows what tagmem must hold: which tags exist on which device, each tag's state and
// counters, every live allocation (address, size, tag, stream) and the bytes written into it.
// Bytes are not stored per allocation: each allocation holds a window of one large random
// pattern, so its expected contents are an offset into that pattern, and checking it is one
// memcmp against device memory (the emulator's device memory is host memory, mapped at the
// device address while the tag is resident).
//
// What the model cannot predict without copying tagmem's policy (how requests pack into
// segments, how many bytes a tag maps) it takes from tagmem's statistics after each step, and
// checks instead the relations that must hold: mapped equals reserved while resident, an
// offloaded tag maps nothing, a reload maps back exactly what the offload released, the
// emulator's device usage equals the sum of the tags' mapped bytes, and so on. verify() is the
// whole list.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tagmem/tagmem.h"

namespace tagmem::fuzz {

inline constexpr int kDevices = 2;
inline constexpr std::size_t kPatternBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxAllocation = std::size_t{32} << 20;  // fits any window
inline constexpr std::size_t kUndefined = SIZE_MAX;  // contents after a DISCARD reload

// The random bytes every allocation's expected contents are a window of.
const unsigned char* pattern();

struct allocation {
  CUdeviceptr ptr = 0;
  std::size_t size = 0;
  int device = 0;
  std::string tag;
  CUstream stream = nullptr;
  std::size_t window = kUndefined;  // offset into pattern() of its contents
};

struct tag_model {
  tagmem_tag_state state = TAGMEM_RESIDENT;
  std::size_t mapped_at_offload = 0;    // what the last (first, if cut short) offload released
  std::size_t reserved_at_offload = 0;  // reserved bytes then: an offload keeps every segment
  std::size_t host_expected = 0;        // host store bytes it holds while offloaded
  std::size_t pieces_expected = 0;      // of which hold bytes a reload copies back
  bool cut_short = false;               // offloaded by a call a driver fault interrupted
  bool lost_bytes = false;              // some of its mappings were dropped (DISCARD)
  bool approximate = false;             // moved by a faulted call: counters are adopted
  bool freed_while_offloaded = false;   // a free gave part of its backup back (adopted, smaller)
  std::uint64_t alloc_count = 0, free_count = 0, offload_count = 0, reload_count = 0;
  std::uint64_t bytes_offloaded = 0, bytes_reloaded = 0;
  std::size_t max_virtual = 0;  // virtual space never shrinks
  tagmem_tag_stats seen{};      // tagmem's statistics after the previous step
};

using tag_key = std::pair<int, std::string>;

struct model {
  std::map<tag_key, tag_model> tags;
  std::vector<allocation> allocations;
  std::vector<std::string> scope;                 // the thread's tag scope, innermost last
  std::vector<CUdeviceptr> freed;                 // addresses freed earlier (for stale frees)
  std::uint64_t device_bytes[kDevices] = {0, 0};  // the emulated devices' sizes
  // A failed cuMemRelease is retried by tagmem later (Note [release later], vm_arena.cpp): until
  // the emulator's counts agree again, it may hold more physical memory than the tags map.
  bool release_pending = false;

  tag_model* find(int device, const std::string& name);
  const char* current_tag() const;
  std::size_t live_in(int device, const std::string& name) const;
  // The index of the live allocation starting at `ptr`, or -1.
  long find_allocation(CUdeviceptr ptr) const;
  // Whether [ptr, ptr + size) overlaps a live allocation.
  bool overlaps(CUdeviceptr ptr, std::size_t size) const;
};

// Fills `a` with pattern bytes at `window` (direct host access to emulated device memory).
void write_window(allocation& a, std::size_t window);

// Compares tagmem and the emulator with the model; returns "" or what differs. Refreshes each
// tag's `seen` statistics. `bytes_verified` grows by the bytes compared.
std::string verify(model& m, std::uint64_t* bytes_verified);

}  // namespace tagmem::fuzz
