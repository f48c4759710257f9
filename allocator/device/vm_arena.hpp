// vm_arena.hpp — one tag's virtual address space on one device, and the physical memory
// mapped into it.
//
// The arena reserves large virtual ranges (config::arena_bytes each, more when full) and hands
// out granularity-aligned pieces first-fit by address, so segments allocated one after another
// sit next to each other and an offloaded tag reloads as a few large contiguous runs
// (Note [reload coalescing] in offload_engine.cpp). Physical memory is tracked as mappings: a
// range of addresses backed by one cuMemCreate'd handle, or by several side by side when kept
// handles were recycled into it (Note [physical recycling] in physical_recycler.hpp). A mapping
// is resident (mapped, with access) or not (unmapped by an offload; its record stays so reload
// knows what to restore).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "device/device.hpp"
#include "device/physical_recycler.hpp"
#include "host/metadata_heap.hpp"

namespace tagmem {

class tag;

struct mapping {
  std::size_t size = 0;
  meta_vector<physical_part> parts;  // in address order, adding up to size; while resident
  bool resident = false;
};

// What an unmap does with the physical memory it takes away.
enum class unmapped_memory {
  release,                // cuMemRelease before returning
  release_in_background,  // the device's release queue (Note [background release])
  recycle,                // the device's recycler (Note [physical recycling])
  park,  // left mapped and parked with the recycler, recycled if that fails (Note [parked
         // mappings])
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

  // Backs `bytes` at `va` with physical memory (kept handles first when `recycle`, Note
  // [physical recycling]) and grants access; on failure nothing stays created or mapped. Records
  // a resident mapping.
  void map_new(CUdeviceptr va, std::size_t bytes, bool recycle = false);
  // Unmaps the resident mapping at `va` and disposes of its memory as `then` says; the record
  // stays, not resident. Throws with nothing changed if cuMemUnmap fails. If only cuMemRelease
  // fails, the mapping is gone (not resident) and the error is thrown; see Note [release later].
  // With `give_to`, each unmapped handle is offered to it first and only the ones it refuses are
  // disposed of as `then` says; a mapping it wants is unmapped rather than parked (Note [handoff]
  // in handoff/service.hpp).
  void unmap(CUdeviceptr va, unmapped_memory then = unmapped_memory::release,
             physical_sink* give_to = nullptr);
  // Releases handles whose cuMemRelease failed earlier and that the release queue could not take
  // (Note [release later]); keeps those that fail again.
  void release_unreleased() noexcept;
  bool has_unreleased() const noexcept { return !unreleased_.empty(); }
  // Makes the record at `va` resident again if the recycler still has it parked (Note [parked
  // mappings]); no driver call. Returns whether it did.
  bool reclaim_parked(CUdeviceptr va) noexcept;
  // Forgets a mapping record (it must not be resident; a parked one is unmapped and kept).
  void forget(CUdeviceptr va);
  // Replaces the non-resident records inside [va, va + bytes) with one resident mapping of
  // `parts`, which the caller mapped there (reload coalescing).
  void adopt(CUdeviceptr va, std::size_t bytes, meta_vector<physical_part> parts);

  meta_map<CUdeviceptr, mapping>& mappings() noexcept { return mappings_; }
  const meta_map<CUdeviceptr, mapping>& mappings() const noexcept { return mappings_; }
  std::size_t mapped_bytes() const noexcept { return mapped_bytes_; }
  // The non-resident mappings' bytes, and the longest span of them side by side in address space
  // (the largest received handle a reload of them can map, Note [runs grow to the handles held]).
  struct offloaded_extent {
    std::size_t bytes = 0;
    std::size_t largest_span = 0;
  };
  offloaded_extent offloaded() const noexcept;
  std::size_t virtual_bytes() const noexcept { return virtual_bytes_; }
  device& dev() noexcept { return dev_; }
  // The owner plans to offload with BACKUP: new mappings wake the background pinner (Note [pin
  // ahead]). Set under the owning tag's mutex.
  bool pins_ahead() const noexcept { return pins_ahead_; }
  void set_pins_ahead(bool on) noexcept { pins_ahead_ = on; }

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
  bool pins_ahead_ = false;
};

}  // namespace tagmem
