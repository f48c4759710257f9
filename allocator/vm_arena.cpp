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
#include "vm_arena.hpp"

#include "address_index.hpp"
#include "byte_math.hpp"
#include "driver/driver.hpp"

namespace tagmem {

CUmemGenericAllocationHandle map_physical(device& dev, CUdeviceptr va, std::size_t bytes) {
  const auto& api = driver::api();
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = api.cuMemCreate(&handle, bytes, &dev.allocation_prop(), 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && dev.releases().pending_bytes() != 0) {
    dev.releases().drain();  // Note [background release]
    r = api.cuMemCreate(&handle, bytes, &dev.allocation_prop(), 0);
  }
  driver::check(r, "cuMemCreate");
  r = api.cuMemMap(va, bytes, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    api.cuMemRelease(handle);
    driver::throw_error(r, "cuMemMap");
  }
  r = api.cuMemSetAccess(va, bytes, &dev.access_desc(), 1);
  if (r != CUDA_SUCCESS) {
    api.cuMemUnmap(va, bytes);
    api.cuMemRelease(handle);
    driver::throw_error(r, "cuMemSetAccess");
  }
  return handle;
}

void unmap_physical(device& dev, CUdeviceptr va, std::size_t bytes,
                    CUmemGenericAllocationHandle handle) noexcept {
  driver::api().cuMemUnmap(va, bytes);
  if (driver::api().cuMemRelease(handle) == CUDA_SUCCESS) return;
  try {
    dev.releases().push(handle, bytes);  // tried again in the background and by every drain
  } catch (...) {  // no memory even for that record: the handle leaks, nothing else is lost
  }
}

vm_arena::vm_arena(device& dev, const config& cfg, tag* owner)
    : dev_(dev), cfg_(cfg), owner_(owner) {}

void vm_arena::release_unreleased() noexcept {
  std::erase_if(unreleased_, [](CUmemGenericAllocationHandle h) {
    return driver::api().cuMemRelease(h) == CUDA_SUCCESS;
  });
}

vm_arena::~vm_arena() {
  release_unreleased();
  const auto& api = driver::api();
  for (auto& [va, m] : mappings_) {
    if (!m.resident) continue;
    api.cuMemUnmap(va, m.size);
    api.cuMemRelease(m.handle);
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

void vm_arena::map_new(CUdeviceptr va, std::size_t bytes) {
  auto [it, inserted] = mappings_.emplace(va, mapping{bytes, 0, false});
  TAGMEM_ASSERT(inserted);
  release_unreleased();
  try {
    context_guard guard(dev_.context());
    it->second.handle = map_physical(dev_, va, bytes);
  } catch (...) {
    mappings_.erase(it);
    throw;
  }
  it->second.resident = true;
  mapped_bytes_ += bytes;
}

void vm_arena::unmap(CUdeviceptr va, release_timing when) {
  auto it = mappings_.find(va);
  TAGMEM_ASSERT(it != mappings_.end() && it->second.resident);
  mapping& m = it->second;
  release_unreleased();
  unreleased_.reserve(unreleased_.size() + 1);  // so that keeping the handle below cannot fail
  context_guard guard(dev_.context());
  CUresult r = driver::api().cuMemUnmap(va, m.size);
  if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemUnmap");  // still mapped and resident
  m.resident = false;
  mapped_bytes_ -= m.size;
  CUmemGenericAllocationHandle h = m.handle;
  m.handle = 0;
  if (when == release_timing::background) {
    try {
      dev_.releases().push(h, m.size);
      return;
    } catch (...) {  // the thread cannot take it: release it here
    }
  }
  r = driver::api().cuMemRelease(h);
  if (r != CUDA_SUCCESS) {
    try {
      dev_.releases().push(h, m.size);  // Note [release later]
    } catch (...) {
      unreleased_.push_back(h);  // room reserved above
    }
    driver::throw_error(r, "cuMemRelease");
  }
}

void vm_arena::forget(CUdeviceptr va) {
  auto it = mappings_.find(va);
  TAGMEM_ASSERT(it != mappings_.end() && !it->second.resident);
  mappings_.erase(it);
}

void vm_arena::adopt(CUdeviceptr va, std::size_t bytes, CUmemGenericAllocationHandle handle) {
  auto first = mappings_.lower_bound(va);
  auto last = mappings_.lower_bound(va + bytes);
  for (auto it = first; it != last; ++it) TAGMEM_ASSERT(!it->second.resident);
  mappings_.erase(first, last);
  mappings_.emplace(va, mapping{bytes, handle, true});
  mapped_bytes_ += bytes;
}

}  // namespace tagmem
