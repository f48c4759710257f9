// contexts.cpp — cuDevicePrimaryCtxRetain, cuCtxGet/SetCurrent, cuCtxGetDevice, cuMemGetInfo;
// see contexts.hpp. The entry points that wait for streams or tear a context down
// (cuCtxSynchronize, cuDevicePrimaryCtxRelease) sit a layer above, in synchronize.cpp.
//
// A CUcontext is the address of its device's slot in a fixed array, so validating one is a range
// check and the handle stays the same across retain/release cycles, as the real primary context
// does. The current context is a thread_local pointer.
#include "contexts.hpp"

#include <array>
#include <atomic>

#include "api.hpp"

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

CUresult resolve_context(lock& held, CUcontext ctx, int* device) {
  context* slot = ctx == nullptr ? current : from_handle(ctx);
  if (slot == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = slot->device;
  return check_context(held, slot->device, slot->generation);
}

CUresult drop_primary_reference(lock&, int device, std::optional<uint64_t>* dying) {
  context& c = table().slots[device];
  if (c.refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c.refs == 0) *dying = c.generation++;
  return CUDA_SUCCESS;
}

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

TAGMEM_EMU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  TAGMEM_EMU_ENTRY(cuCtxGetDevice);
  return get_device(device, nullptr);
}
