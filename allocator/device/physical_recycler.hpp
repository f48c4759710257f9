// physical_recycler.hpp — unmapped physical memory kept inside the process to be mapped again,
// instead of released to the driver and created anew.
//
// Note [physical recycling]: handing memory back to the driver costs a scrub in time linear in
// the bytes (Note [background release]), and creating it again costs as much; while the scrub
// runs it also competes with the copies beside it. When the memory a tag gives up is wanted by
// another tag of the same process, neither is needed: the handles are unmapped from the one and
// mapped into the other. The recycler is a device's pool of such handles, by size:
//  - a swap's out-side puts its handles here as it unmaps and its in-side maps them; what is left
//    at the end of the swap goes to the release queue (TAGMEM_RECYCLE_PHYSICAL=swap, the default);
//  - with TAGMEM_RECYCLE_PHYSICAL=keep, every offload puts its handles here and they stay, so that
//    a later reload or swap maps them; tagmem_release_physical and tagmem_wait_released give
//    them back to the driver, and so does anything of tagmem's that runs out of memory. An
//    allocation's new segment never takes them (block_pool maps fresh handles): it meets them
//    only when its cuMemCreate runs out of memory, which releases them first;
//  - with `off`, nothing is recycled.
// Note [parked mappings]: with `keep`, a DISCARD offload does not even unmap. Its mappings are
// parked here as they are, still mapped at the tag's addresses, and the tag counts as offloaded.
// A reload of that tag takes its parked mappings back (reclaim) with no driver call at all, so a
// DISCARD offload and reload in one process cost bookkeeping only, however many GiB the tag
// holds (unmapping and mapping 60 GiB again costs milliseconds, most of it cuMemSetAccess:
// docs/performance.md, "RL cycle"). Anything else that needs kept memory (a reload or swap of
// another tag, tagmem_release_physical, a cuMemCreate out of memory) unparks a mapping first:
// cuMemUnmap of its range, under the recycler's lock so that the tag cannot reclaim it half way;
// its handles are then plain kept handles. Until that happens, the offloaded tag's addresses
// still read and write its old memory instead of faulting: only an application that touches a
// tag it offloaded can tell, and its bytes were discarded anyway.
// cuMemMap maps a whole handle (offset 0), so a handle of S bytes can only back S bytes of
// address space. A mapping record (vm_arena.hpp) may therefore consist of several handles mapped
// side by side; a range of B bytes takes, largest first, the kept handles that fit in what is
// left of it, and one new handle covers the rest (sizes are all multiples of the granularity, so
// the rest is one too). The driver accepts cuMemUnmap and cuMemSetAccess over adjacent mappings,
// so a composite record is still unmapped and given access with one call each.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "host/metadata_heap.hpp"

namespace tagmem {

class device;
class release_queue;

// One physical allocation mapped at some offset of a mapping record.
struct physical_part {
  CUmemGenericAllocationHandle handle = 0;
  std::size_t size = 0;
};

class physical_recycler {
 public:
  physical_recycler() = default;
  ~physical_recycler();  // releases what it still holds (the caller keeps the context alive)
  physical_recycler(const physical_recycler&) = delete;
  physical_recycler& operator=(const physical_recycler&) = delete;

  // Keeps an unmapped handle. Returns false (keeping nothing) when its record cannot be made:
  // the caller then releases the handle itself.
  bool put(physical_part p) noexcept;
  // Takes, largest first, kept handles whose sizes add up to at most `bytes`; appends them to
  // `out` (throws OUT_OF_MEMORY for room in `out` with nothing taken).
  void take_up_to(std::size_t bytes, meta_vector<physical_part>& out);
  // Parks the mapping of `size` bytes at `va`, made of `parts` (Note [parked mappings]); on
  // success `parts` is left empty. Returns false, keeping nothing, when the record cannot be
  // made: the caller then unmaps as usual. A mapping parked `ahead` (Note [mapped ahead] in
  // offload/map_ahead.hpp) is its tag's: take_up_to leaves it, the rest treat it as any.
  bool park(CUdeviceptr va, std::size_t size, meta_vector<physical_part>& parts,
            bool ahead = false) noexcept;
  // Takes back the mapping parked at `va` if it is still parked: its parts go to `out` (emptied
  // first) and stay mapped. Returns false, changing nothing, when it was unparked meanwhile.
  bool reclaim(CUdeviceptr va, meta_vector<physical_part>& out) noexcept;
  // Hands every kept handle to `q` (one it cannot take is released here), unparking first;
  // mappings parked ahead only `with_ahead`.
  void release_all(release_queue& q, bool with_ahead = true) noexcept;
  // Unmaps the mappings parked ahead before `cutoff` and hands their handles to `q` (one it
  // cannot take is released here); returns their bytes. One whose unmap fails stays parked.
  std::size_t release_ahead_before(std::chrono::steady_clock::time_point cutoff,
                                   release_queue& q) noexcept;
  // Releases kept handles on this thread, smallest first (parked ones last, those parked ahead
  // only `with_ahead`), until at least `bytes` went back to the driver or none is left. Returns
  // the first failure (CUDA_SUCCESS if none); a handle that failed stays kept, for the next
  // release.
  CUresult release_now(std::size_t bytes, bool with_ahead = true) noexcept;
  // Kept bytes, parked ones included.
  std::size_t bytes() const noexcept;
  std::size_t parked_bytes() const noexcept;
  bool parked(CUdeviceptr va) const noexcept {
    std::lock_guard lock(mutex_);
    return parked_.count(va) != 0;
  }
  // The bytes of the mappings parked at the addresses of `records` (a tag's mapping records,
  // keyed by address, each with a `size`).
  template <class Records>
  std::size_t parked_bytes_at(const Records& records) const noexcept {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [va, record] : records) {
      if (auto it = parked_.find(va); it != parked_.end()) n += it->second.size;
    }
    return n;
  }

 private:
  struct parked_mapping {
    std::size_t size = 0;
    meta_vector<physical_part> parts;
    bool ahead = false;
    std::chrono::steady_clock::time_point since;  // when parked ahead
  };
  void hand_to_queue(meta_vector<physical_part>& parts, release_queue& q) noexcept;
  // Unmaps the oldest parked mapping and keeps its handles as unmapped ones. Returns the unmap's
  // result; on failure the mapping stays parked (and is not tried again by this call's caller).
  CUresult unpark_first_locked() noexcept;
  CUresult unpark_all_locked(bool with_ahead = true) noexcept;

  mutable std::mutex mutex_;  // a leaf, like the release queue's (cuMemUnmap runs under it)
  std::multimap<std::size_t, CUmemGenericAllocationHandle, std::less<std::size_t>,
                meta_allocator<std::pair<const std::size_t, CUmemGenericAllocationHandle>>>
      kept_;                                      // by size
  meta_map<CUdeviceptr, parked_mapping> parked_;  // by address
  std::size_t bytes_ = 0;
  std::size_t parked_bytes_ = 0;
  std::size_t ahead_bytes_ = 0;
};

class physical_source;

// A reload's leave to send one held handle to the driver for room (Note [reload waits for
// peers]): `allowed` until one goes, and only while no handle arrived since the try began
// (`arrivals_seen`, physical_source::arrivals() then): one that did may serve the next try.
struct room_leave {
  bool allowed = true;
  std::uint64_t arrivals_seen = 0;
};

// Backs [va, va + bytes) with physical memory: kept handles first when `recycle`, then handles
// from `from` (received from the job's other processes, Note [handoff] in handoff/service.hpp),
// one new handle for the rest, mapped side by side and given access with one call (none when
// `access` is false: the caller grants it later, Note [access in one call] in
// offload/offload_engine.cpp). When
// cuMemCreate runs out of memory it releases kept handles and pending releases (Note [background
// release]), and without `from` also the received handles held, and tries again. With `from`
// and `room` allowed it may instead send one handle of `from` that the range could not use to
// the driver, for room to create what the others do not cover, and then disallows `room`. On
// failure nothing stays mapped or created, taken handles go back where they came from, and the
// error is thrown. `limits` bound what is taken from `from` and what is created: a range of which
// more than `most_created` bytes would have to be created is left alone (what was taken goes
// back, nothing is mapped, and the result is empty). Needs the device's context current.
struct map_limits {
  std::size_t most_received = SIZE_MAX;
  std::size_t most_created = SIZE_MAX;
};
meta_vector<physical_part> map_parts(device& dev, CUdeviceptr va, std::size_t bytes, bool recycle,
                                     physical_source* from = nullptr, room_leave* room = nullptr,
                                     bool access = true, map_limits limits = {});

// Unmaps [va, va + bytes) and disposes of its handles: kept by the recycler when `recycle`,
// else released (a handle whose release fails goes to the release queue). Never throws: if the
// unmap fails the handles are released anyway (the driver frees the memory once nothing maps it)
// and the range stays mapped, so a later map there fails cleanly.
void unmap_parts(device& dev, CUdeviceptr va, std::size_t bytes,
                 const meta_vector<physical_part>& parts, bool recycle) noexcept;

}  // namespace tagmem
