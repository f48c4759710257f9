// vm_arena.hpp — one tag's virtual address space on one device, and the physical memory
// mapped into it.
//
// The arena reserves large virtual ranges (config::arena_bytes each, more when full) and hands
// out granularity-aligned pieces first-fit by address, so segments allocated one after another
// sit next to each other and an offloaded tag reloads as a few large contiguous runs
// (Note [reload coalescing] in offload_engine.cpp). Physical memory is tracked as mappings: one
// cuMemCreate'd handle mapped at one address. A mapping is resident (mapped, with access) or
// not (unmapped and released by an offload; its record stays so reload knows what to restore).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "device.hpp"
#include "metadata_heap.hpp"

namespace tagmem {

class tag;

// When unmap() gives a mapping's physical memory back to the driver.
enum class release_timing {
  now,         // cuMemRelease in the caller
  background,  // left to the device's release queue (Note [background release])
};

struct mapping {
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;  // valid while resident
  bool resident = false;
};

class vm_arena {
 public:
  vm_arena(device& dev, const config& cfg, tag* owner);
  ~vm_arena();  // unmaps and releases everything, frees the reservations
  vm_arena(const vm_arena&) = delete;
  vm_arena& operator=(const vm_arena&) = delete;

  // Virtual space: `bytes` must be a multiple of the granularity. Throws OUT_OF_MEMORY / DRIVER.
  CUdeviceptr allocate_va(std::size_t bytes);
  void free_va(CUdeviceptr va, std::size_t bytes);

  // Creates physical memory of `bytes`, maps it at `va` and grants access; on failure nothing
  // stays created or mapped. Records a resident mapping.
  void map_new(CUdeviceptr va, std::size_t bytes);
  // Unmaps and releases the resident mapping at `va`; the record stays, not resident. Throws
  // with nothing changed if cuMemUnmap fails. If only cuMemRelease fails, the mapping is gone
  // (not resident) and the error is thrown; see Note [release later]. `when` says who releases
  // the memory (release_timing).
  void unmap(CUdeviceptr va, release_timing when = release_timing::now);
  // Releases handles whose cuMemRelease failed earlier and that the release queue could not take
  // (Note [release later]); keeps those that fail again.
  void release_unreleased() noexcept;
  bool has_unreleased() const noexcept { return !unreleased_.empty(); }
  // Forgets a mapping record (it must not be resident).
  void forget(CUdeviceptr va);
  // Replaces the non-resident records inside [va, va + bytes) with one resident mapping of
  // `handle`, which the caller mapped there (reload coalescing).
  void adopt(CUdeviceptr va, std::size_t bytes, CUmemGenericAllocationHandle handle);

  meta_map<CUdeviceptr, mapping>& mappings() noexcept { return mappings_; }
  const meta_map<CUdeviceptr, mapping>& mappings() const noexcept { return mappings_; }
  std::size_t mapped_bytes() const noexcept { return mapped_bytes_; }
  std::size_t virtual_bytes() const noexcept { return virtual_bytes_; }
  device& dev() noexcept { return dev_; }

 private:
  struct reservation {
    CUdeviceptr base;
    std::size_t size;
  };
  device& dev_;
  const config& cfg_;
  tag* owner_;
  meta_vector<reservation> reservations_;
  meta_map<CUdeviceptr, std::size_t> free_va_;            // start -> length, coalesced
  meta_map<CUdeviceptr, mapping> mappings_;               // start -> mapping
  meta_vector<CUmemGenericAllocationHandle> unreleased_;  // see Note [release later]
  std::size_t mapped_bytes_ = 0;
  std::size_t virtual_bytes_ = 0;
};

// The driver steps behind map_new()/unmap(), usable on their own by the offload engine.
// map_physical creates, maps and grants access (rolling back on failure) and returns the handle;
// when cuMemCreate runs out of memory while releases are pending it waits for them and tries
// again (Note [background release]).
CUmemGenericAllocationHandle map_physical(device& dev, CUdeviceptr va, std::size_t bytes);
// Unmaps and releases, never throwing: a handle whose release fails goes to the device's release
// queue to be tried again; if the unmap fails the handle is released anyway (the driver frees the
// memory once nothing maps it) and the range stays mapped, so a later map there fails cleanly.
void unmap_physical(device& dev, CUdeviceptr va, std::size_t bytes,
                    CUmemGenericAllocationHandle handle) noexcept;

}  // namespace tagmem
