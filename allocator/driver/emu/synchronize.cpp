// synchronize.cpp — the entry points that reach every layer of the emulator: cuStreamSynchronize
// and cuCtxSynchronize (wait for streams, then trim the device's pool, as the real driver's
// synchronize does) and cuDevicePrimaryCtxRelease, which tears the context down the way the driver
// does when its last reference goes: queued work on its streams runs to completion, its
// cuMemAlloc blocks and its own footprint (TAGMEM_EMU_CONTEXT_BYTES) are freed, its sticky error
// is cleared, and its generation moves on. See the layers in api.hpp.
#include <optional>

#include "api.hpp"
#include "classic.hpp"
#include "contexts.hpp"
#include "streams.hpp"

using namespace tagmem::emu;

namespace {

// cuCtxSynchronize for `ctx`, or for the current context when null.
CUresult synchronize_context(CUcontext ctx) {
  int device = 0;
  {
    lock held = take_lock();
    if (CUresult r = resolve_context(held, ctx, &device); r != CUDA_SUCCESS) return r;
  }
  return synchronize_device(device);
}

}  // namespace

TAGMEM_EMU_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  TAGMEM_EMU_ENTRY(cuStreamSynchronize);
  target where;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, handle, &where); r != CUDA_SUCCESS) return r;
  }
  wait_idle(where);
  return finish_synchronize(where.device);
}

TAGMEM_EMU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  TAGMEM_EMU_ENTRY(cuDevicePrimaryCtxRelease);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  lock held = take_lock();
  std::optional<uint64_t> dying;
  if (CUresult r = drop_primary_reference(held, dev, &dying); r != CUDA_SUCCESS) return r;
  if (!dying) return CUDA_SUCCESS;
  held.unlock();
  drain_device_streams(dev, *dying);
  held.lock();
  release_context_allocations(held, dev, *dying);
  uncharge(held, dev, context_bytes());
  clear_sticky_error(dev);
  return CUDA_SUCCESS;
}

// Note [unversioned names] in entry_points.def: the _v2 form takes the context explicitly (null:
// the current one); the old unversioned symbol stays exported for callers linked against it.
TAGMEM_EMU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  TAGMEM_EMU_ENTRY(cuCtxSynchronize);
  return synchronize_context(ctx);
}

#undef cuCtxSynchronize

TAGMEM_EMU_EXPORT CUresult cuCtxSynchronize(void) {
  TAGMEM_EMU_ENTRY(cuCtxSynchronize);
  return synchronize_context(nullptr);
}
