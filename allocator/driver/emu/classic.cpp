// classic.cpp — device allocations and pools; see classic.hpp.
//
// Sizes are rounded up to whole host pages (so every block is at least 256-byte aligned, as
// cuMemAlloc promises) and counted against the device until the block goes back to the OS,
// cached pool blocks included, as the real driver counts a pool's reserved memory. A block under
// free is marked `freeing` before the emulator waits for copies to leave it (Note [emu pins]),
// so no other thread can free or reuse it meanwhile.
#include "classic.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <map>

#include "address_space.hpp"
#include "api.hpp"
#include "contexts.hpp"
#include "streams.hpp"

namespace tagmem::emu {
namespace {

enum class block_state { in_use, free_pending, cached, freeing };

struct block {
  int device = 0;
  uint64_t generation = 0;  // of the context it was made in
  size_t size = 0;
  bool pooled = false;  // from cuMemAllocAsync: cached rather than unmapped when freed
  block_state state = block_state::in_use;
};

struct pool {
  cuuint64_t release_threshold = 0;
  std::multimap<size_t, uintptr_t> cached;  // size -> base
  uint64_t cached_bytes = 0;
};

struct tables {
  std::map<uintptr_t, block> blocks;
  std::array<pool, max_devices> pools;
};

tables& t() {
  static tables* instance = new tables;  // leaked: see Note [emu locking]
  return *instance;
}

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// Unmaps a block once no copy holds it; the caller has taken it out of use.
void destroy(lock& held, uintptr_t base) {
  for (;;) {
    auto it = t().blocks.find(base);
    if (it == t().blocks.end()) return;  // another teardown got there first
    if (any_pinned(held, base, it->second.size)) {
      wait_unpinned(held, base, it->second.size);
      continue;
    }
    ::munmap(reinterpret_cast<void*>(base), it->second.size);
    remove_region(held, base);
    uncharge(held, it->second.device, it->second.size);
    t().blocks.erase(it);
    return;
  }
}

void release_cached(lock& held, int device, uint64_t keep_bytes) {
  pool& p = t().pools[device];
  while (p.cached_bytes > keep_bytes && !p.cached.empty()) {
    auto it = std::prev(p.cached.end());  // largest first
    const uintptr_t base = it->second;
    p.cached_bytes -= it->first;
    p.cached.erase(it);
    t().blocks[base].state = block_state::freeing;
    destroy(held, base);
  }
}

CUresult allocate(lock& held, int device, size_t size, bool pooled, CUdeviceptr* out) {
  const size_t bytes = round_up(size, page_size());
  if (!charge(held, device, bytes)) {
    release_cached(held, device, 0);
    if (!charge(held, device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED) {
    uncharge(held, device, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto base = reinterpret_cast<uintptr_t>(at);
  add_region(held, region{.base = base,
                          .size = bytes,
                          .kind = region_kind::device_allocation,
                          .memory = nullptr,
                          .readers = all_devices,
                          .writers = all_devices});
  t().blocks[base] = block{device, context_generation(held, device), bytes, pooled};
  ++live(held).device_allocations;
  *out = base;
  return CUDA_SUCCESS;
}

// Called when a stream reaches a cuMemFreeAsync.
void finish_free(uintptr_t base) {
  lock held = take_lock();
  auto it = t().blocks.find(base);
  if (it == t().blocks.end() || it->second.state != block_state::free_pending) return;
  block& b = it->second;
  if (!b.pooled) {
    b.state = block_state::freeing;
    destroy(held, base);
    return;
  }
  b.state = block_state::cached;
  pool& p = t().pools[b.device];
  p.cached.emplace(b.size, base);
  p.cached_bytes += b.size;
}

pool* find_pool(CUmemoryPool handle) {
  for (int d = 0; d < device_count(); ++d)
    if (reinterpret_cast<pool*>(handle) == &t().pools[d]) return &t().pools[d];
  return nullptr;
}

}  // namespace

CUresult finish_synchronize(int device) {
  lock held = take_lock();
  release_cached(held, device, t().pools[device].release_threshold);
  return sticky_error(device);
}

CUresult synchronize_device(int device) {
  wait_device_streams(device);
  return finish_synchronize(device);
}

void release_context_allocations(lock& held, int device, uint64_t generation) {
  pool& p = t().pools[device];
  for (auto it = p.cached.begin(); it != p.cached.end();) {
    if (t().blocks[it->second].generation != generation) {
      ++it;
      continue;
    }
    p.cached_bytes -= it->first;
    it = p.cached.erase(it);
  }
  for (;;) {
    uintptr_t victim = 0;
    for (auto& [base, b] : t().blocks)
      if (b.device == device && b.generation == generation && b.state != block_state::freeing) {
        if (b.state == block_state::in_use) --live(held).device_allocations;
        b.state = block_state::freeing;
        victim = base;
        break;
      }
    if (victim == 0) return;
    destroy(held, victim);
  }
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  TAGMEM_EMU_ENTRY(cuMemAlloc);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  int device = 0;
  if (CUresult r = current_device(held, &device); r != CUDA_SUCCESS) return r;
  return allocate(held, device, bytesize, /*pooled=*/false, dptr);
}

TAGMEM_EMU_EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  TAGMEM_EMU_ENTRY(cuMemFree);
  if (dptr == 0) return CUDA_SUCCESS;  // as the real driver (measured)
  int device = 0;
  {
    lock held = take_lock();
    if (CUresult r = current_device(held, &device); r != CUDA_SUCCESS) return r;
    auto it = t().blocks.find(dptr);
    if (it == t().blocks.end() || it->second.state != block_state::in_use)
      return CUDA_ERROR_INVALID_VALUE;
    device = it->second.device;
  }
  synchronize_device(device);  // cuMemFree synchronizes, as cudaFree does
  lock held = take_lock();
  auto it = t().blocks.find(dptr);
  if (it == t().blocks.end() || it->second.state != block_state::in_use)
    return CUDA_ERROR_INVALID_VALUE;  // freed by another thread meanwhile
  it->second.state = block_state::freeing;
  --live(held).device_allocations;
  destroy(held, dptr);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  TAGMEM_EMU_ENTRY(cuMemAllocAsync);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  target where;
  if (CUresult r = resolve_stream(held, stream, &where); r != CUDA_SUCCESS) return r;
  pool& p = t().pools[where.device];
  auto hit = p.cached.find(round_up(bytesize, page_size()));
  if (hit == p.cached.end()) return allocate(held, where.device, bytesize, /*pooled=*/true, dptr);
  block& b = t().blocks[hit->second];
  b.state = block_state::in_use;
  b.generation = context_generation(held, where.device);
  p.cached_bytes -= b.size;
  *dptr = hit->second;
  p.cached.erase(hit);
  ++live(held).device_allocations;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  TAGMEM_EMU_ENTRY(cuMemFreeAsync);
  target where;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, stream, &where); r != CUDA_SUCCESS) return r;
    if (dptr == 0) return CUDA_SUCCESS;  // as the real driver (measured)
    auto it = t().blocks.find(dptr);
    if (it == t().blocks.end() || it->second.state != block_state::in_use)
      return CUDA_ERROR_INVALID_VALUE;
    it->second.state = block_state::free_pending;
    --live(held).device_allocations;
  }
  submit(where, [dptr] {
    finish_free(dptr);
    return CUDA_SUCCESS;
  });
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  TAGMEM_EMU_ENTRY(cuDeviceGetDefaultMemPool);
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool_out = reinterpret_cast<CUmemoryPool>(&t().pools[dev]);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool handle, CUmemPool_attribute attr,
                                                 void* value) {
  TAGMEM_EMU_ENTRY(cuMemPoolSetAttribute);
  pool* p = find_pool(handle);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: {
      lock held = take_lock();
      p->release_threshold = *static_cast<const cuuint64_t*>(value);
      return CUDA_SUCCESS;
    }
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      return CUDA_SUCCESS;  // reuse never races queued work here (classic.hpp)
    default:
      return CUDA_ERROR_INVALID_VALUE;  // read-only or unknown, as measured
  }
}
