// interposed.cpp — the wrapped driver entry points' behaviour (see interposed.hpp).
//
// Every function takes the record table's mutex before its driver call and keeps it until the
// records agree with the driver again, so pause (which holds the same mutex throughout) sees
// either the whole effect of a call or none of it.
//
// Note [records after the runtime]: the lock order is the runtime's lifetime lock, then the
// records' mutex, then the runtime's nccl holds. Pause and resume take a runtime hold before the
// records' mutex, and tagmem's own calls read the `nccl` tag's records under a hold (its stats,
// and tagmem_shutdown asking whether NCCL keeps the runtime). So a call here that reports to the
// runtime (runtime::nccl_hold, which takes the lifetime lock) lets the records' mutex go first:
// memory outside the records is tagged memory, which pause never touches, and what the records
// must learn of a call is written before the mutex is let go.
#include "interposed.hpp"

#include <fcntl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>

#include "api/runtime.hpp"
#include "records.hpp"

namespace tagmem::nccl {
namespace {

enum class classic_mode { passthrough, vmm };

struct classic_config {
  classic_mode mode = classic_mode::passthrough;
  std::size_t min_bytes = 0;
};

const classic_config& classic() {
  static const classic_config cfg = [] {
    classic_config c;
    // Read on NCCL's first cuMemAlloc, where nothing can fail (tagmem_init refuses a bad value).
    const char* who = "[tagmem preload]";
    if (number_or_default(spec_of(option::NCCL_CUMEMALLOC), who) == 1) c.mode = classic_mode::vmm;
    c.min_bytes = number_or_default(spec_of(option::NCCL_CLASSIC_MIN_BYTES), who);
    return c;
  }();
  return cfg;
}

meta_map<CUdeviceptr, std::size_t>& passthrough_blocks() {
  static auto* m = new meta_map<CUdeviceptr, std::size_t>;  // guarded by the records' mutex
  return *m;
}

CUmemAllocationProp properties_of(CUmemGenericAllocationHandle real, bool* ok) {
  CUmemAllocationProp p{};
  auto fn = captured().cuMemGetAllocationPropertiesFromHandle.load();
  if (!fn) {
    try {
      driver::load();
      fn = driver::api().cuMemGetAllocationPropertiesFromHandle;
    } catch (...) {
      fn = nullptr;
    }
  }
  *ok = fn && fn(&p, real) == CUDA_SUCCESS;
  return p;
}

// The device of the calling thread's current context, or -1.
int current_device() {
  try {
    driver::load();
    CUdevice d = 0;
    if (driver::api().cuCtxGetDevice(&d, nullptr) == CUDA_SUCCESS) return static_cast<int>(d);
  } catch (const error&) {
  }
  return -1;
}

// Replaces the access entry of each location in `desc` on mapping `m`.
void remember_access(mapping_record& m, const CUmemAccessDesc* desc, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    auto same = [&](const CUmemAccessDesc& e) {
      return e.location.type == desc[i].location.type && e.location.id == desc[i].location.id;
    };
    std::erase_if(m.access, same);
    m.access.push_back(desc[i]);
  }
}

// Reports a binding of tagged memory after the driver call succeeded (Note [nccl holds]); it
// cannot be undone here, so without memory to record it the binding goes unrecorded.
template <class F>
void note_held(F&& f) noexcept {
  try {
    f();
  } catch (...) {
  }
}

// The mappings of `a` that start inside [va, va + size).
template <class F>
void for_mappings_in(allocation& a, CUdeviceptr va, std::size_t size, F&& f) {
  for (mapping_record& m : a.mappings)
    if (m.va >= va && m.va < va + size) f(m);
}

}  // namespace

captured_driver& captured() {
  static captured_driver* c = new captured_driver;
  return *c;
}

passthrough_counters& counters() {
  static passthrough_counters* c = new passthrough_counters;
  return *c;
}

CUresult mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                    const CUmemAllocationProp* prop, unsigned long long flags) {
  auto real = captured().cuMemCreate.load();
  if (!handle || !prop) return real(handle, size, prop, flags);
  std::lock_guard lock(records().mutex());
  CUresult r = real(handle, size, prop, flags);
  if (r != CUDA_SUCCESS) return r;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    counters().host_located_bytes += size;
    return r;
  }
  try {
    allocation& a = records().add(origin::created, *handle, size, *prop);
    *handle = a.visible;
  } catch (const std::bad_alloc&) {
    // No memory for the record: the allocation stays the application's, unrecorded.
  }
  return r;
}

CUresult mem_release(CUmemGenericAllocationHandle handle) {
  auto real = captured().cuMemRelease.load();
  std::unique_lock lock(records().mutex());
  allocation* a = records().by_visible(handle);
  if (!a) {
    lock.unlock();  // Note [records after the runtime]
    const CUresult r = real(handle);
    if (r == CUDA_SUCCESS) runtime::nccl_hold::released(handle);  // Note [nccl holds]
    return r;
  }
  if (a->app_refs <= 0) return CUDA_ERROR_INVALID_VALUE;  // what the driver says, too
  if (a->app_refs == 1 && a->real_held) {
    if (CUresult r = real(a->real); r != CUDA_SUCCESS) return r;
    a->real_held = false;
  }
  a->app_refs--;
  records().erase_if_unreachable(*a);
  return CUDA_SUCCESS;
}

CUresult mem_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags) {
  auto real = captured().cuMemMap.load();
  std::unique_lock lock(records().mutex());
  allocation* a = records().by_visible(handle);
  if (!a) {
    lock.unlock();  // Note [records after the runtime]
    const CUresult r = real(va, size, offset, handle, flags);
    if (r != CUDA_SUCCESS) return r;
    try {
      runtime::nccl_hold::mapped(handle, va);
    } catch (const std::bad_alloc&) {
      // An unrecorded second mapping of tagged memory would go stale at the tag's offload.
      captured().cuMemUnmap.load()(va, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
  }
  if (a->app_refs <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (a->released) return CUDA_ERROR_NOT_PERMITTED;  // NCCL ran while paused
  CUresult r = real(va, size, offset, a->real, flags);
  if (r == CUDA_SUCCESS) {
    try {
      records().add_mapping(*a, va, size, offset);
    } catch (const std::bad_alloc&) {
      captured().cuMemUnmap.load()(va, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  return r;
}

CUresult mem_unmap(CUdeviceptr va, size_t size) {
  auto real = captured().cuMemUnmap.load();
  std::unique_lock lock(records().mutex());
  meta_vector<allocation*> hit = records().mapped_in(va, size);
  if (hit.empty()) {
    lock.unlock();  // Note [records after the runtime]
    const CUresult r = real(va, size);
    if (r == CUDA_SUCCESS) runtime::nccl_hold::unmapped(va, size);
    return r;
  }
  bool any_resident = false;
  for (allocation* a : hit) any_resident |= !a->released;
  if (any_resident) {
    if (CUresult r = real(va, size); r != CUDA_SUCCESS) return r;
  }
  for (allocation* a : hit) {
    meta_vector<CUdeviceptr> gone;
    for_mappings_in(*a, va, size, [&](mapping_record& m) { gone.push_back(m.va); });
    for (CUdeviceptr m : gone) records().remove_mapping(*a, m);
    if (a->from != origin::classic) records().erase_if_unreachable(*a);
  }
  return CUDA_SUCCESS;
}

CUresult mem_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc* desc, size_t count) {
  auto real = captured().cuMemSetAccess.load();
  std::lock_guard lock(records().mutex());
  meta_vector<allocation*> hit = records().mapped_in(va, size);
  if (hit.empty() || !desc || count == 0) return real(va, size, desc, count);
  bool any_resident = false;
  for (allocation* a : hit) any_resident |= !a->released;
  if (any_resident) {
    if (CUresult r = real(va, size, desc, count); r != CUDA_SUCCESS) return r;
  }
  try {
    for (allocation* a : hit) {
      for_mappings_in(*a, va, size, [&](mapping_record& m) { remember_access(m, desc, count); });
      for (size_t i = 0; a->home_device < 0 && i < count; ++i)
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
          a->home_device = desc[i].location.id;
    }
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

CUresult mem_address_free(CUdeviceptr va, size_t size) {
  auto real = captured().cuMemAddressFree.load();
  std::lock_guard lock(records().mutex());
  CUresult r = real(va, size);
  if (r != CUDA_SUCCESS) return r;
  // Mappings of released records vanish with their range (NCCL freed the buffer while paused).
  for (allocation* a : records().mapped_in(va, size)) {
    if (!a->released) continue;
    meta_vector<CUdeviceptr> gone;
    for_mappings_in(*a, va, size, [&](mapping_record& m) { gone.push_back(m.va); });
    for (CUdeviceptr m : gone) records().remove_mapping(*a, m);
    records().erase_if_unreachable(*a);
  }
  return r;
}

CUresult mem_export(void* shareable, CUmemGenericAllocationHandle handle,
                    CUmemAllocationHandleType type, unsigned long long flags) {
  auto real = captured().cuMemExportToShareableHandle.load();
  std::unique_lock lock(records().mutex());
  allocation* a = records().by_visible(handle);
  if (!a) {
    lock.unlock();  // Note [records after the runtime]
    const CUresult r = real(shareable, handle, type, flags);
    if (r == CUDA_SUCCESS) runtime::nccl_hold::exported(handle);  // Note [nccl holds]
    return r;
  }
  if (a->app_refs <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (a->released) return CUDA_ERROR_NOT_PERMITTED;
  CUresult r = real(shareable, a->real, type, flags);
  if (r != CUDA_SUCCESS) return r;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    a->foreign_export = true;  // Note [matching shared allocations]: cannot be re-shared
    return r;
  }
  a->exported_ever = true;
  int dup = ::fcntl(*static_cast<int*>(shareable), F_DUPFD_CLOEXEC, 0);
  try {
    if (dup < 0) throw std::bad_alloc();
    a->exports.push_back({dup, false});
  } catch (const std::bad_alloc&) {
    close_quietly(dup);
    a->foreign_export = true;  // unmatched forever: it stays resident, which is safe
  }
  return r;
}

CUresult mem_import(CUmemGenericAllocationHandle* handle, void* os_handle,
                    CUmemAllocationHandleType type) {
  auto real = captured().cuMemImportFromShareableHandle.load();
  std::lock_guard lock(records().mutex());
  CUresult r = real(handle, os_handle, type);
  if (r != CUDA_SUCCESS || !handle) return r;
  bool ok = false;
  CUmemAllocationProp prop = properties_of(*handle, &ok);
  if (!ok || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return r;
  try {
    allocation& a = records().add(origin::imported, *handle, 0, prop);
    a.app_refs = 1;
    a.home_device = current_device();
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
      a.import_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    }
    if (a.import_fd < 0) a.foreign_export = true;  // cannot be matched: stays resident
    *handle = a.visible;
  } catch (const std::bad_alloc&) {
  }
  return r;
}

CUresult mem_retain(CUmemGenericAllocationHandle* handle, void* address) {
  auto real = captured().cuMemRetainAllocationHandle.load();
  std::unique_lock lock(records().mutex());
  allocation* a = records().by_address(reinterpret_cast<CUdeviceptr>(address));
  if (!a && handle) {
    lock.unlock();  // Note [records after the runtime]
    // Tagged memory (a registered user buffer): Note [nccl holds].
    try {
      std::optional<CUresult> r = runtime::nccl_hold::retain(
          reinterpret_cast<CUdeviceptr>(address), handle, [&] { return real(handle, address); });
      if (r) return *r;
    } catch (const std::bad_alloc&) {
      return CUDA_ERROR_OUT_OF_MEMORY;  // nothing retained
    }
    // Another address of held tagged memory (NCCL's second mapping of it): counted the same,
    // since its release will be.
    const CUresult r = real(handle, address);
    if (r == CUDA_SUCCESS) runtime::nccl_hold::retained(*handle);
    return r;
  }
  if (!a || !handle || a->from == origin::classic) return real(handle, address);
  if (!a->released && !a->real_held) {
    CUmemGenericAllocationHandle h = 0;
    if (CUresult r = real(&h, address); r != CUDA_SUCCESS) return r;
    a->real_held = true;
  }
  a->app_refs++;
  *handle = a->visible;
  return CUDA_SUCCESS;
}

CUresult mem_get_properties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  auto real = captured().cuMemGetAllocationPropertiesFromHandle.load();
  std::lock_guard lock(records().mutex());
  allocation* a = records().by_visible(handle);
  if (!a) return real(prop, handle);
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  if (a->released) {
    *prop = a->prop;
    return CUDA_SUCCESS;
  }
  return real(prop, a->real);
}

CUresult multicast_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                            CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                            unsigned long long flags) {
  auto real = captured().cuMulticastBindMem.load();
  std::lock_guard lock(records().mutex());
  allocation* a = records().by_visible(mem);
  if (!a) return real(mc, mc_offset, mem, mem_offset, size, flags);
  if (a->released) return CUDA_ERROR_NOT_PERMITTED;
  CUresult r = real(mc, mc_offset, a->real, mem_offset, size, flags);
  if (r == CUDA_SUCCESS) a->multicast = true;  // stays resident: the multicast object binds it
  return r;
}

CUresult multicast_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr mem,
                             size_t size, unsigned long long flags) {
  auto real = captured().cuMulticastBindAddr.load();
  std::unique_lock lock(records().mutex());
  CUresult r = real(mc, mc_offset, mem, size, flags);
  if (r == CUDA_SUCCESS) {
    for (allocation* a : records().mapped_in(mem, size)) a->multicast = true;
    if (allocation* a = records().by_address(mem)) a->multicast = true;
    lock.unlock();  // Note [records after the runtime]
    note_held([&] { runtime::nccl_hold::pinned(mem, size, "a multicast object (NVLS)"); });
  }
  return r;
}

CUresult mem_get_handle_for_range(void* handle, CUdeviceptr va, size_t size,
                                  CUmemRangeHandleType type, unsigned long long flags) {
  auto real = captured().cuMemGetHandleForAddressRange.load();
  std::unique_lock lock(records().mutex());
  CUresult r = real(handle, va, size, type, flags);
  if (r == CUDA_SUCCESS) {
    // A dma-buf of this range goes to a NIC (GPUDirect RDMA registration), which keeps the
    // physical pages it was given: the allocation must never move. Note [what stays resident].
    for (allocation* a : records().mapped_in(va, size)) a->dma_buf = true;
    if (allocation* a = records().by_address(va)) a->dma_buf = true;
    lock.unlock();  // Note [records after the runtime]
    note_held([&] { runtime::nccl_hold::pinned(va, size, "a dma-buf (GPUDirect RDMA)"); });
  }
  return r;
}

// ---- cuMemAlloc / cuMemFree --------------------------------------------------------------------

namespace {

// Serves cuMemAlloc with virtual memory of its own: a reservation, one exportable physical
// allocation of the rounded size, mapped read-write for the current device.
CUresult serve_classic(CUdeviceptr* dptr, size_t size) {
  try {
    driver::load();
  } catch (const error&) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  const auto& api = driver::api();
  CUdevice dev = 0;
  if (CUresult r = api.cuCtxGetDevice(&dev, nullptr); r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(dev);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t granularity = 0;
  if (CUresult r = api.cuMemGetAllocationGranularity(&granularity, &prop,
                                                     CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS)
    return r;
  const std::size_t span = (size + granularity - 1) / granularity * granularity;
  CUdeviceptr va = 0;
  if (CUresult r = api.cuMemAddressReserve(&va, span, granularity, 0, 0); r != CUDA_SUCCESS)
    return r;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = api.cuMemCreate(&h, span, &prop, 0);
  if (r != CUDA_SUCCESS) {
    api.cuMemAddressFree(va, span);
    return r;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = api.cuMemMap(va, span, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    r = api.cuMemSetAccess(va, span, &access, 1);
    if (r != CUDA_SUCCESS) api.cuMemUnmap(va, span);
  }
  if (r == CUDA_SUCCESS) {
    try {
      allocation& a = records().add(origin::classic, h, span, prop);
      a.app_refs = 0;  // the application holds a pointer, not a handle
      a.classic_base = va;
      a.classic_span = span;
      records().add_mapping(a, va, span, 0);
      a.mappings.back().access.push_back(access);
      *dptr = va;
      return CUDA_SUCCESS;
    } catch (const std::bad_alloc&) {
      if (allocation* a = records().by_address(va)) records().erase(*a);
      api.cuMemUnmap(va, span);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  api.cuMemRelease(h);
  api.cuMemAddressFree(va, span);
  return r;
}

}  // namespace

CUresult mem_alloc(CUdeviceptr* dptr, size_t size) {
  auto real = captured().cuMemAlloc.load();
  std::lock_guard lock(records().mutex());
  if (dptr && size > 0 && classic().mode == classic_mode::vmm && size >= classic().min_bytes)
    return serve_classic(dptr, size);
  CUresult r = real(dptr, size);
  if (r == CUDA_SUCCESS && dptr) {
    try {
      passthrough_blocks()[*dptr] = size;
      counters().classic_bytes_now += size;
    } catch (const std::bad_alloc&) {
    }
  }
  return r;
}

CUresult mem_free(CUdeviceptr dptr) {
  auto real = captured().cuMemFree.load();
  std::lock_guard lock(records().mutex());
  allocation* a = records().by_address(dptr);
  if (!a || a->from != origin::classic || a->classic_base != dptr) {
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS) {
      auto it = passthrough_blocks().find(dptr);
      if (it != passthrough_blocks().end()) {
        counters().classic_bytes_now -= it->second;
        passthrough_blocks().erase(it);
      }
    }
    return r;
  }
  const auto& api = driver::api();
  // cuMemFree waits for the device; unmapping memory a kernel still uses is undefined.
  if (CUresult r = api.cuCtxSynchronize(nullptr); r != CUDA_SUCCESS) return r;
  if (!a->released) {
    if (CUresult r = api.cuMemUnmap(a->classic_base, a->classic_span); r != CUDA_SUCCESS) return r;
    if (a->real_held) api.cuMemRelease(a->real);
  }
  api.cuMemAddressFree(a->classic_base, a->classic_span);
  records().erase(*a);
  return CUDA_SUCCESS;
}

}  // namespace tagmem::nccl
