// vmm.cpp — address reservations, map, unmap, access and cuMemRetainAllocationHandle.
//
// The operating system does the real work: a reservation is an anonymous PROT_NONE
// MAP_NORESERVE mapping, cuMemMap replaces part of it with a MAP_SHARED|MAP_FIXED PROT_NONE
// mapping of the memfd, cuMemSetAccess mprotects it, and cuMemUnmap puts an anonymous PROT_NONE
// mapping back. So memory that is reserved but unmapped, mapped without access, or unmapped
// faults (SIGSEGV) when touched, as device memory faults on a GPU.
//
// The checks follow the real driver as measured on an H200 (driver 580): sizes and addresses
// are multiples of the 2 MiB granularity; a mapping covers its whole allocation at offset 0
// (anything else is CUDA_ERROR_NOT_SUPPORTED); cuMemSetAccess and cuMemUnmap take ranges made
// of whole mappings, several adjacent ones allowed; cuMemAddressFree takes back exactly one
// reservation and refuses while anything in it is mapped; host access can be granted only to
// host-located allocations. Where the real driver is lax the
// emulator is strict, to catch bugs: a mapping must lie inside one reservation, and unmapping a
// range that is not mapped is an error (the real driver returns success). For tests,
// tagmem_emu_hold_next_map holds the next cuMemMap until tagmem_emu_release_held_map.
#include <sys/mman.h>

#include <bit>
#include <vector>

#include "address_space.hpp"
#include "api.hpp"
#include "physical.hpp"
#include "test_hold.hpp"

namespace tagmem::emu {
namespace {

// tagmem_emu_hold_next_map: the next cuMemMap waits.
test_hold& held_map() {
  static test_hold h;
  return h;
}

constexpr int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

void* map_fixed_none(uintptr_t base, size_t size) {
  return ::mmap(reinterpret_cast<void*>(base), size, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0);
}

// An anonymous PROT_NONE range of `size` bytes aligned to `alignment`, at `hint` if free.
uintptr_t reserve_range(size_t size, size_t alignment, uintptr_t hint) {
  if (hint != 0 && aligned(hint, alignment)) {
    void* at = ::mmap(reinterpret_cast<void*>(hint), size, PROT_NONE,
                      reserve_flags | MAP_FIXED_NOREPLACE, -1, 0);
    if (at == reinterpret_cast<void*>(hint)) return hint;
    if (at != MAP_FAILED) ::munmap(at, size);  // a kernel without MAP_FIXED_NOREPLACE
  }
  void* raw = ::mmap(nullptr, size + alignment, PROT_NONE, reserve_flags, -1, 0);
  if (raw == MAP_FAILED) return 0;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = round_up(start, alignment);
  if (base > start) ::munmap(raw, base - start);
  if (const uintptr_t tail = start + size + alignment - (base + size); tail > 0)
    ::munmap(reinterpret_cast<void*>(base + size), tail);
  return base;
}

// The CPU may touch what any device (or, for host-located memory, the host) may.
int protection(const region& r) {
  if (r.writers != 0 || r.host_access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return PROT_READ | PROT_WRITE;
  return r.readers != 0 || r.host_access != 0 ? PROT_READ : PROT_NONE;
}

bool host_location(CUmemLocationType type) {
  return type == CU_MEM_LOCATION_TYPE_HOST || type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
}

// Host access may be granted to host-located allocations only (NCCL does, for its host buffers).
bool host_access_allowed(const std::vector<region*>& mappings) {
  for (const region* r : mappings)
    if (!host_location(r->memory->prop.location.type)) return false;
  return true;
}

}  // namespace
}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                               CUdeviceptr addr, unsigned long long flags) {
  TAGMEM_EMU_ENTRY(cuMemAddressReserve);
  if (ptr == nullptr || flags != 0 || size == 0 || !aligned(size, granularity))
    return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && !std::has_single_bit(alignment)) return CUDA_ERROR_INVALID_VALUE;
  const size_t align = alignment > granularity ? alignment : granularity;
  if (size + align < size) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t base = reserve_range(size, align, addr);
  if (base == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  lock held = take_lock();
  add_reservation(held, base, size);
  ++live(held).reservations;
  *ptr = base;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  TAGMEM_EMU_ENTRY(cuMemAddressFree);
  lock held = take_lock();
  if (size == 0 || reservation_at(held, ptr) != size || any_region_in(held, ptr, size))
    return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(ptr), size);
  remove_reservation(held, ptr);
  --live(held).reservations;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                    CUmemGenericAllocationHandle handle, unsigned long long flags) {
  TAGMEM_EMU_ENTRY(cuMemMap);
  if (flags != 0 || size == 0 || !aligned(ptr, granularity) || !aligned(size, granularity))
    return CUDA_ERROR_INVALID_VALUE;
  if (held_map().take()) held_map().wait();
  lock held = take_lock();
  auto memory = find_handle(held, handle);
  if (!memory) return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0 || size != memory->size) return CUDA_ERROR_NOT_SUPPORTED;
  if (!inside_one_reservation(held, ptr, size) || any_region_in(held, ptr, size))
    return CUDA_ERROR_INVALID_VALUE;
  void* at =
      ::mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, memory->fd, 0);
  if (at == MAP_FAILED) {
    map_fixed_none(ptr, size);  // MAP_FIXED may have dropped the reservation's pages
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  add_mapping(held, *memory);
  add_region(held, region{.base = ptr, .size = size, .memory = memory});
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  TAGMEM_EMU_ENTRY(cuMemUnmap);
  lock held = take_lock();
  for (;;) {  // see Note [emu pins]
    if (whole_mappings(held, ptr, size).empty()) return CUDA_ERROR_INVALID_VALUE;
    if (!any_pinned(held, ptr, size)) break;
    wait_unpinned(held, ptr, size);
  }
  map_fixed_none(ptr, size);
  for (region* r : whole_mappings(held, ptr, size)) {
    auto memory = r->memory;
    remove_region(held, r->base);
    remove_mapping(held, *memory);
  }
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                          size_t count) {
  TAGMEM_EMU_ENTRY(cuMemSetAccess);
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  bool for_host = false;
  for (size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc& d = desc[i];
    if (host_location(d.location.type))
      for_host = true;
    else if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_NOT_SUPPORTED;
    else if (!valid_device(d.location.id))
      return CUDA_ERROR_INVALID_VALUE;
    if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  lock held = take_lock();
  for (;;) {  // see Note [emu pins]
    if (whole_mappings(held, ptr, size).empty()) return CUDA_ERROR_INVALID_VALUE;
    if (!any_pinned(held, ptr, size)) break;
    wait_unpinned(held, ptr, size);
  }
  const std::vector<region*> mappings = whole_mappings(held, ptr, size);
  if (for_host && !host_access_allowed(mappings)) return CUDA_ERROR_NOT_SUPPORTED;  // measured
  for (region* r : mappings) {
    for (size_t i = 0; i < count; ++i) {
      if (host_location(desc[i].location.type)) {
        r->host_access = desc[i].flags;
        continue;
      }
      const uint64_t bit = uint64_t{1} << desc[i].location.id;
      const bool read = (desc[i].flags & CU_MEM_ACCESS_FLAGS_PROT_READ) != 0;
      const bool write = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r->readers = read ? r->readers | bit : r->readers & ~bit;
      r->writers = write ? r->writers | bit : r->writers & ~bit;
    }
    if (::mprotect(reinterpret_cast<void*>(r->base), r->size, protection(*r)) != 0)
      return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                       void* addr) {
  TAGMEM_EMU_ENTRY(cuMemRetainAllocationHandle);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  region* r = region_at(held, reinterpret_cast<uintptr_t>(addr));
  if (r == nullptr || r->kind != region_kind::mapping) return CUDA_ERROR_INVALID_VALUE;
  // The same handle value that was mapped, even after it was released (measured).
  retain_handle(held, *r->memory);
  *handle = r->memory->handle;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT void tagmem_emu_hold_next_map(void) { held_map().arm(); }

TAGMEM_EMU_EXPORT void tagmem_emu_release_held_map(void) { held_map().release(); }
