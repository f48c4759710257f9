// interposed.hpp — what each wrapped driver entry point does on the application's behalf.
//
// The preload shim hands these to NCCL in place of the driver's functions (through
// cuGetProcAddress). Each calls the driver function the application asked for (captured when
// it was wrapped) and records device-located allocations in the record table (records.hpp),
// translating handles per Note [virtual handles]. Host-located allocations and anything the
// table does not know pass through untouched. While the tag is paused, calls on released
// records are answered from the records (unmap, access, properties, release) or refused with
// CUDA_ERROR_NOT_PERMITTED (map, export: NCCL may not run between pause and resume).
// cuMulticastBind* and cuMemGetHandleForAddressRange (dma-buf, for NIC registration) mark the
// allocations they touch as unable to move (Note [what stays resident] in collective.cpp).
// What NCCL does to tagged memory (a user buffer it registered: retain, export, release, a
// second mapping, unmap, multicast binding, dma-buf) goes to the driver as asked and is reported
// to the registry, which refuses to offload a tag while NCCL holds some of it (Note [nccl holds]
// in allocator/registry/nccl_holds.hpp).
//
// cuMemAlloc (what NCCL uses with NCCL_CUMEM_ENABLE=0): requests of at least
// TAGMEM_NCCL_CLASSIC_MIN_BYTES (default 1 MiB) are served by the shim with virtual memory of
// their own (a reservation, one exportable physical allocation, mapped) so that a pause can
// release them, when TAGMEM_NCCL_CUMEMALLOC=vmm; smaller ones, and all with the default
// TAGMEM_NCCL_CUMEMALLOC=passthrough, go to the driver and stay resident (counted). Legacy CUDA
// IPC (cuIpcGetMemHandle) does not work on virtual memory, so `vmm` is only for jobs that never
// share these buffers that way (NCCL_CUMEM_ENABLE=0 needs NCCL_P2P_DISABLE=1 with it).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>

namespace tagmem::nccl {

// The driver functions the application was given, captured when the shim wrapped them. The
// first non-null capture wins; all later ones are the same functions.
struct captured_driver {
#define TAGMEM_NCCL_CAPTURED(name) std::atomic<decltype(&::name)> name{nullptr};
#include "captured_entry_points.def"
#undef TAGMEM_NCCL_CAPTURED
};
captured_driver& captured();

CUresult mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                    const CUmemAllocationProp* prop, unsigned long long flags);
CUresult mem_release(CUmemGenericAllocationHandle handle);
CUresult mem_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags);
CUresult mem_unmap(CUdeviceptr va, size_t size);
CUresult mem_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult mem_address_free(CUdeviceptr va, size_t size);
CUresult mem_export(void* shareable, CUmemGenericAllocationHandle handle,
                    CUmemAllocationHandleType type, unsigned long long flags);
CUresult mem_import(CUmemGenericAllocationHandle* handle, void* os_handle,
                    CUmemAllocationHandleType type);
CUresult mem_retain(CUmemGenericAllocationHandle* handle, void* address);
CUresult mem_get_properties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle);
CUresult multicast_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                            CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                            unsigned long long flags);
CUresult multicast_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr mem,
                             size_t size, unsigned long long flags);
CUresult mem_get_handle_for_range(void* handle, CUdeviceptr va, size_t size,
                                  CUmemRangeHandleType type, unsigned long long flags);
CUresult mem_alloc(CUdeviceptr* dptr, size_t size);
CUresult mem_free(CUdeviceptr dptr);

// Counters kept outside the records (they describe allocations that are not recorded).
struct passthrough_counters {
  std::atomic<std::size_t> host_located_bytes{0};  // host-located cuMemCreate bytes, ever
  std::atomic<std::size_t> classic_bytes_now{0};   // cuMemAlloc bytes passed to the driver
};
passthrough_counters& counters();

}  // namespace tagmem::nccl
