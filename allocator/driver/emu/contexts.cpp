// contexts.cpp — cuDevicePrimaryCtx*, cuCtx*, cuMemGetInfo; see contexts.hpp.
//
// A CUcontext is the address of its device's slot in a fixed array, so validating one is a range
// check and the handle stays the same across retain/release cycles, as the real primary context
// does. The current context is a thread_local pointer. Releasing the last reference tears the
// context down the way the driver does: queued work on its streams runs to completion, its
// cuMemAlloc blocks and its own footprint (TAGMEM_EMU_CONTEXT_BYTES) are freed, its sticky error
// is cleared, and its generation moves on.
#include "contexts.hpp"

#include <array>
#include <atomic>

#include "api.hpp"
#include "classic.hpp"
#include "streams.hpp"

namespace tagmem::emu {
namespace {

struct context {
  int device = 0;
  int refs = 0;
  uint64_t generation = 0;
};

struct context_table {
  std::array<context, max_devices> slots;
  std::array<std::atomic<int>, max_devices> sticky{};  // CUresult, CUDA_SUCCESS when healthy

  context_table() {
    for (int d = 0; d < max_devices; ++d) slots[d].device = d;
  }
};

context_table& table() {
  static context_table* instance = new context_table;  // leaked: see Note [emu locking]
  return *instance;
}

thread_local context* current = nullptr;

context* from_handle(CUcontext handle) {
  auto* slot = reinterpret_cast<context*>(handle);
  context_table& t = table();
  for (int d = 0; d < device_count(); ++d)
    if (slot == &t.slots[d]) return slot;
  return nullptr;
}

CUcontext to_handle(context* slot) { return reinterpret_cast<CUcontext>(slot); }

// cuCtxGetDevice for `ctx`, or for the current context when null.
CUresult get_device(CUdevice* device, CUcontext ctx) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  context* slot = ctx == nullptr ? current : from_handle(ctx);
  if (slot == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = slot->device;  // answered even by a released context, as the real driver does
  return CUDA_SUCCESS;
}

// cuCtxSynchronize for `ctx`, or for the current context when null.
CUresult synchronize(CUcontext ctx) {
  context* slot = ctx == nullptr ? current : from_handle(ctx);
  if (slot == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  {
    lock held = take_lock();
    if (CUresult r = check_context(held, slot->device, slot->generation); r != CUDA_SUCCESS)
      return r;
  }
  return synchronize_device(slot->device);
}

}  // namespace

CUresult current_device(lock& held, int* device) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = current->device;
  return check_context(held, current->device, current->generation);
}

CUresult check_context(lock&, int device, uint64_t generation) {
  const context& c = table().slots[device];
  if (c.refs == 0 || c.generation != generation) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return sticky_error(device);
}

uint64_t context_generation(lock&, int device) { return table().slots[device].generation; }

CUresult sticky_error(int device) {
  return static_cast<CUresult>(table().sticky[device].load(std::memory_order_acquire));
}

void raise_sticky_error(int device, CUresult error) {
  int expected = CUDA_SUCCESS;
  table().sticky[device].compare_exchange_strong(expected, error, std::memory_order_acq_rel);
}

void clear_sticky_error(int device) {
  table().sticky[device].store(CUDA_SUCCESS, std::memory_order_release);
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  TAGMEM_EMU_ENTRY(cuDevicePrimaryCtxRetain);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  context& c = table().slots[dev];
  if (c.refs == 0 && !charge(held, dev, context_bytes())) return CUDA_ERROR_OUT_OF_MEMORY;
  ++c.refs;
  *pctx = to_handle(&c);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  TAGMEM_EMU_ENTRY(cuDevicePrimaryCtxRelease);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  lock held = take_lock();
  context& c = table().slots[dev];
  if (c.refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c.refs > 0) return CUDA_SUCCESS;
  const uint64_t dying = c.generation++;
  held.unlock();
  drain_device_streams(dev, dying);
  held.lock();
  release_context_allocations(held, dev, dying);
  uncharge(held, dev, context_bytes());
  clear_sticky_error(dev);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  TAGMEM_EMU_ENTRY(cuCtxGetCurrent);
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = to_handle(current);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  TAGMEM_EMU_ENTRY(cuCtxSetCurrent);
  if (ctx == nullptr) {
    current = nullptr;
    return CUDA_SUCCESS;
  }
  context* slot = from_handle(ctx);
  if (slot == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  current = slot;
  return CUDA_SUCCESS;
}

// Note [unversioned names] in entry_points.def: cuGetProcAddress hands out the _v2 forms, which
// take the context explicitly (null: the current one); the old unversioned symbols stay exported
// below for callers linked against them.
TAGMEM_EMU_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  TAGMEM_EMU_ENTRY(cuCtxGetDevice);
  return get_device(device, ctx);
}

TAGMEM_EMU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  TAGMEM_EMU_ENTRY(cuCtxSynchronize);
  return synchronize(ctx);
}

TAGMEM_EMU_EXPORT CUresult cuMemGetInfo(size_t* free, size_t* total) {
  TAGMEM_EMU_ENTRY(cuMemGetInfo);
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  int device = 0;
  if (CUresult r = current_device(held, &device); r != CUDA_SUCCESS) return r;
  const uint64_t size = device_total(held, device);
  const uint64_t used = device_used(held, device);
  *total = size;
  *free = used >= size ? 0 : size - used;
  return CUDA_SUCCESS;
}

#undef cuCtxGetDevice
#undef cuCtxSynchronize

TAGMEM_EMU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  TAGMEM_EMU_ENTRY(cuCtxGetDevice);
  return get_device(device, nullptr);
}

TAGMEM_EMU_EXPORT CUresult cuCtxSynchronize(void) {
  TAGMEM_EMU_ENTRY(cuCtxSynchronize);
  return synchronize(nullptr);
}
