// driver_wrappers.cpp — exact-ABI wrappers over the `nccl` tag's behaviour (see header).
#include "driver_wrappers.hpp"

#include <cuda.h>

#include <cstring>

#include "interposed.hpp"
#include "reentry_guard.hpp"

namespace tagmem::preload {
namespace {

using nccl::captured;

// Calls the behaviour, or the driver's function when re-entered from inside the shim.
#define TAGMEM_WRAP(name, behaviour, ...)                                  \
  if (reentry_guard::inside()) return captured().name.load()(__VA_ARGS__); \
  reentry_guard guard;                                                     \
  return nccl::behaviour(__VA_ARGS__)

CUresult w_create(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                  unsigned long long flags) {
  TAGMEM_WRAP(cuMemCreate, mem_create, h, size, prop, flags);
}
CUresult w_release(CUmemGenericAllocationHandle h) { TAGMEM_WRAP(cuMemRelease, mem_release, h); }
CUresult w_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
               unsigned long long flags) {
  TAGMEM_WRAP(cuMemMap, mem_map, va, size, offset, h, flags);
}
CUresult w_unmap(CUdeviceptr va, size_t size) { TAGMEM_WRAP(cuMemUnmap, mem_unmap, va, size); }
CUresult w_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc* desc, size_t count) {
  TAGMEM_WRAP(cuMemSetAccess, mem_set_access, va, size, desc, count);
}
CUresult w_address_free(CUdeviceptr va, size_t size) {
  TAGMEM_WRAP(cuMemAddressFree, mem_address_free, va, size);
}
CUresult w_export(void* shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                  unsigned long long flags) {
  TAGMEM_WRAP(cuMemExportToShareableHandle, mem_export, shareable, h, type, flags);
}
CUresult w_import(CUmemGenericAllocationHandle* h, void* os_handle,
                  CUmemAllocationHandleType type) {
  TAGMEM_WRAP(cuMemImportFromShareableHandle, mem_import, h, os_handle, type);
}
CUresult w_retain(CUmemGenericAllocationHandle* h, void* address) {
  TAGMEM_WRAP(cuMemRetainAllocationHandle, mem_retain, h, address);
}
CUresult w_properties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle h) {
  TAGMEM_WRAP(cuMemGetAllocationPropertiesFromHandle, mem_get_properties, prop, h);
}
CUresult w_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                    CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                    unsigned long long flags) {
  TAGMEM_WRAP(cuMulticastBindMem, multicast_bind_mem, mc, mc_offset, mem, mem_offset, size, flags);
}
CUresult w_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr mem,
                     size_t size, unsigned long long flags) {
  TAGMEM_WRAP(cuMulticastBindAddr, multicast_bind_addr, mc, mc_offset, mem, size, flags);
}
CUresult w_range_handle(void* handle, CUdeviceptr va, size_t size, CUmemRangeHandleType type,
                        unsigned long long flags) {
  TAGMEM_WRAP(cuMemGetHandleForAddressRange, mem_get_handle_for_range, handle, va, size, type,
              flags);
}
CUresult w_alloc(CUdeviceptr* dptr, size_t size) { TAGMEM_WRAP(cuMemAlloc, mem_alloc, dptr, size); }
CUresult w_free(CUdeviceptr dptr) { TAGMEM_WRAP(cuMemFree, mem_free, dptr); }

#undef TAGMEM_WRAP

#define TAGMEM_CAPTURE(name)                                                 \
  [](void* real) {                                                           \
    decltype(captured().name.load()) expected = nullptr;                     \
    captured().name.compare_exchange_strong(                                 \
        expected, reinterpret_cast<decltype(captured().name.load())>(real)); \
  }

#define TAGMEM_ENTRY(asked, min_version, wrapper, name) \
  { asked, min_version, reinterpret_cast<void*>(&wrapper), TAGMEM_CAPTURE(name) }

// cuMem* virtual memory management arrived in CUDA 10.2, dma-buf range handles in 11.7,
// multicast in 12.1; cuMemAlloc and
// cuMemFree have had their current (_v2) ABI since 3.2.
const wrapped_entry g_proc_entries[] = {
    TAGMEM_ENTRY("cuMemCreate", 10020, w_create, cuMemCreate),
    TAGMEM_ENTRY("cuMemRelease", 10020, w_release, cuMemRelease),
    TAGMEM_ENTRY("cuMemMap", 10020, w_map, cuMemMap),
    TAGMEM_ENTRY("cuMemUnmap", 10020, w_unmap, cuMemUnmap),
    TAGMEM_ENTRY("cuMemSetAccess", 10020, w_set_access, cuMemSetAccess),
    TAGMEM_ENTRY("cuMemAddressFree", 10020, w_address_free, cuMemAddressFree),
    TAGMEM_ENTRY("cuMemExportToShareableHandle", 10020, w_export, cuMemExportToShareableHandle),
    TAGMEM_ENTRY("cuMemImportFromShareableHandle", 10020, w_import, cuMemImportFromShareableHandle),
    TAGMEM_ENTRY("cuMemRetainAllocationHandle", 11000, w_retain, cuMemRetainAllocationHandle),
    TAGMEM_ENTRY("cuMemGetAllocationPropertiesFromHandle", 10020, w_properties,
                 cuMemGetAllocationPropertiesFromHandle),
    TAGMEM_ENTRY("cuMulticastBindMem", 12010, w_bind_mem, cuMulticastBindMem),
    TAGMEM_ENTRY("cuMulticastBindAddr", 12010, w_bind_addr, cuMulticastBindAddr),
    TAGMEM_ENTRY("cuMemGetHandleForAddressRange", 11070, w_range_handle,
                 cuMemGetHandleForAddressRange),
    TAGMEM_ENTRY("cuMemAlloc", 3020, w_alloc, cuMemAlloc),
    TAGMEM_ENTRY("cuMemFree", 3020, w_free, cuMemFree),
};

// libcuda's exported names for the same functions (the plain cuMemAlloc/cuMemFree symbols are
// the 32-bit-size ABI of CUDA < 3.2 and are left alone).
TAGMEM_PRELOAD_EARLY const char* exported_name(const wrapped_entry& e) {
  if (same_string(e.name, "cuMemAlloc")) return "cuMemAlloc_v2";
  if (same_string(e.name, "cuMemFree")) return "cuMemFree_v2";
  return e.name;
}

}  // namespace

const wrapped_entry* find_proc_entry(const char* name) {
  for (const wrapped_entry& e : g_proc_entries)
    if (std::strcmp(e.name, name) == 0) return &e;
  return nullptr;
}

const wrapped_entry* find_exported_entry(const char* name) {
  for (const wrapped_entry& e : g_proc_entries)
    if (same_string(exported_name(e), name)) return &e;
  return nullptr;
}

}  // namespace tagmem::preload
