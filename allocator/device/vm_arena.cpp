// vm_arena.cpp — virtual ranges and physical mappings of one tag (see vm_arena.hpp).
//
// Note [release later]: once cuMemUnmap has succeeded the memory is gone from the address
// space, whatever cuMemRelease then says. If the release fails, the mapping is recorded as not
// resident (the truth: the caller must not treat it as mapped, and an offload keeps its backup
// piece), the error is reported, and the handle goes to the device's release queue (Note
// [background release]), which tries it again; so does every drain, among them the one a
// cuMemCreate that runs out of memory makes, so the memory is there when the failed offload maps
// its tags back. Only if the queue cannot take the handle does the arena keep it, to release it
// again at its next map or unmap or at the latest in its destructor. A transient failure leaks
// nothing.
#include "device/vm_arena.hpp"

#include <algorithm>

#include "base/byte_math.hpp"
#include "device/address_index.hpp"
#include "device/received_fds.hpp"
#include "device/release_clock.hpp"
#include "driver/driver.hpp"
#include "host/background_pinning.hpp"

namespace tagmem {

vm_arena::vm_arena(device& dev, const config& cfg, tag* owner)
    : dev_(dev), cfg_(cfg), owner_(owner) {}

void vm_arena::release_unreleased() noexcept {
  std::erase_if(unreleased_, [](CUmemGenericAllocationHandle h) {
    return received_fds::release_handle(h) == CUDA_SUCCESS;
  });
}

vm_arena::~vm_arena() {
  release_unreleased();
  const auto& api = driver::api();
  for (auto& [va, m] : mappings_) {
    if (!m.resident && !reclaim_parked(va)) continue;
    api.cuMemUnmap(va, m.size);
    for (const physical_part& p : m.parts) received_fds::release_handle(p.handle);
  }
  for (const reservation& r : reservations_) {
    global_address_index().remove(r.base);
    api.cuMemAddressFree(r.base, r.size);
  }
}

CUdeviceptr vm_arena::allocate_va(std::size_t bytes) {
  TAGMEM_ASSERT(bytes % dev_.granularity() == 0);
  for (auto it = free_va_.begin(); it != free_va_.end(); ++it) {
    if (it->second < bytes) continue;
    CUdeviceptr va = it->first;
    std::size_t rest = it->second - bytes;
    free_va_.erase(it);
    if (rest) free_va_.emplace(va + bytes, rest);
    return va;
  }
  const std::size_t size =
      round_up_checked(std::max(cfg_.arena_bytes, bytes), dev_.granularity(),
                       TAGMEM_ERROR_OUT_OF_MEMORY, "a virtual address reservation");
  CUdeviceptr hint =
      reservations_.empty() ? 0 : reservations_.back().base + reservations_.back().size;
  CUdeviceptr base = 0;
  context_guard guard(dev_.context());
  CUresult r = driver::api().cuMemAddressReserve(&base, size, dev_.granularity(), hint, 0);
  if (r != CUDA_SUCCESS) {
    fail(r == CUDA_ERROR_OUT_OF_MEMORY ? TAGMEM_ERROR_OUT_OF_MEMORY : TAGMEM_ERROR_DRIVER,
         "cuMemAddressReserve of " + std::to_string(size) +
             " bytes of virtual address space failed: " + driver::describe(r));
  }
  try {
    reservations_.push_back({base, size});
    global_address_index().add(base, size, owner_);
  } catch (...) {
    if (!reservations_.empty() && reservations_.back().base == base) reservations_.pop_back();
    driver::api().cuMemAddressFree(base, size);
    throw;
  }
  virtual_bytes_ += size;
  if (size > bytes) free_va(base + bytes, size - bytes);
  return base;
}

void vm_arena::free_va(CUdeviceptr va, std::size_t bytes) {
  auto next = free_va_.lower_bound(va);
  // Coalesce with the neighbours (only within a reservation: reservations may not be adjacent,
  // and when they are, merging is harmless because both ranges are reserved by this arena).
  if (next != free_va_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == va) {
      va = prev->first;
      bytes += prev->second;
      free_va_.erase(prev);
    }
  }
  if (next != free_va_.end() && va + bytes == next->first) {
    bytes += next->second;
    free_va_.erase(next);
  }
  free_va_.emplace(va, bytes);
}

void vm_arena::map_new(CUdeviceptr va, std::size_t bytes, bool recycle) {
  auto [it, inserted] = mappings_.emplace(va, mapping{bytes, {}, false});
  TAGMEM_ASSERT(inserted);
  release_unreleased();
  try {
    context_guard guard(dev_.context());
    it->second.parts = map_parts(dev_, va, bytes, recycle);
  } catch (...) {
    mappings_.erase(it);
    throw;
  }
  it->second.resident = true;
  mapped_bytes_ += bytes;
  if (pins_ahead_) note_backup_growth();  // Note [pin ahead]
}

void vm_arena::unmap(CUdeviceptr va, unmapped_memory then, physical_sink* give_to) {
  auto it = mappings_.find(va);
  TAGMEM_ASSERT(it != mappings_.end() && it->second.resident);
  mapping& m = it->second;
  if (then == unmapped_memory::park && give_to && give_to->wants(m.size)) {
    then = unmapped_memory::recycle;  // a process waiting for memory beats parking it here
  }
  if (then == unmapped_memory::park) {
    if (dev_.recycler().park(va, m.size, m.parts)) {  // Note [parked mappings]
      m.resident = false;
      mapped_bytes_ -= m.size;
      return;
    }
    then = unmapped_memory::recycle;
  }
  release_unreleased();
  // Room so that keeping the handles below cannot fail.
  unreleased_.reserve(unreleased_.size() + m.parts.size());
  context_guard guard(dev_.context());
  CUresult r = driver::api().cuMemUnmap(va, m.size);
  if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemUnmap");  // still mapped and resident
  m.resident = false;
  mapped_bytes_ -= m.size;
  meta_vector<physical_part> parts;
  parts.swap(m.parts);
  CUresult first = CUDA_SUCCESS;
  for (const physical_part& p : parts) {
    if (give_to && give_to->offer(p)) continue;
    if (then == unmapped_memory::recycle && dev_.recycler().put(p)) continue;
    if (then == unmapped_memory::release_in_background) {
      try {
        dev_.releases().push(p.handle, p.size);
        continue;
      } catch (...) {  // the thread cannot take it: release it here
      }
    }
    r = release_clock::release(p.handle, p.size);
    if (r == CUDA_SUCCESS) continue;
    if (first == CUDA_SUCCESS) first = r;
    try {
      dev_.releases().push(p.handle, p.size);  // Note [release later]
    } catch (...) {
      unreleased_.push_back(p.handle);  // room reserved above
    }
  }
  if (first != CUDA_SUCCESS) driver::throw_error(first, "cuMemRelease");
}

bool vm_arena::reclaim_parked(CUdeviceptr va) noexcept {
  auto it = mappings_.find(va);
  TAGMEM_ASSERT(it != mappings_.end() && !it->second.resident);
  if (dev_.recycler().parked_bytes() == 0 || !dev_.recycler().reclaim(va, it->second.parts)) {
    return false;
  }
  it->second.resident = true;
  mapped_bytes_ += it->second.size;
  return true;
}

void vm_arena::forget(CUdeviceptr va) {
  auto it = mappings_.find(va);
  TAGMEM_ASSERT(it != mappings_.end() && !it->second.resident);
  if (reclaim_parked(va)) {  // the range is still mapped: unmapped before it can be reused
    context_guard guard(dev_.context());
    unmap_parts(dev_, va, it->second.size, it->second.parts, true);
    mapped_bytes_ -= it->second.size;
  }
  mappings_.erase(it);
}

vm_arena::offloaded_extent vm_arena::offloaded() const noexcept {
  offloaded_extent out;
  CUdeviceptr end = 0;  // of the span so far
  std::size_t span = 0;
  for (const auto& [va, m] : mappings_) {
    if (m.resident) {
      span = 0;
      continue;
    }
    out.bytes += m.size;
    span = span != 0 && va == end ? span + m.size : m.size;
    end = va + m.size;
    out.largest_span = std::max(out.largest_span, span);
  }
  return out;
}

void vm_arena::adopt(CUdeviceptr va, std::size_t bytes, meta_vector<physical_part> parts) {
  auto first = mappings_.lower_bound(va);
  auto last = mappings_.lower_bound(va + bytes);
  for (auto it = first; it != last; ++it) TAGMEM_ASSERT(!it->second.resident);
  mappings_.erase(first, last);
  mappings_.emplace(va, mapping{bytes, std::move(parts), true});
  mapped_bytes_ += bytes;
}

}  // namespace tagmem
