// contexts.hpp — primary contexts, the calling thread's current context and sticky errors.
//
// Each device has one primary context, reference-counted by cuDevicePrimaryCtxRetain/Release.
// Its generation grows each time the last reference goes: streams and events remember the
// generation they were created in, and calls on them after that fail with
// CUDA_ERROR_CONTEXT_IS_DESTROYED, as on the real driver.
//
// Note [emu sticky errors]: when an asynchronous operation faults (a copy touches memory that is
// no longer mapped with access), the real driver poisons the whole context: from then on every
// call that uses it — synchronize and query on any of its streams or events, new copies, stream
// and event creation, cuMemAlloc, cuMemGetInfo — returns that error, while context-free calls
// (cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease) still work. Measured on an H200: a faulting
// host<->device copy gives CUDA_ERROR_LAUNCH_FAILED, a faulting device-to-device copy or memset
// CUDA_ERROR_ILLEGAL_ADDRESS. Only releasing the primary context clears it. The emulator keeps
// one such error per device and checks it wherever a context is resolved.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "state.hpp"

namespace tagmem::emu {

// The calling thread's current context's device; fails with CUDA_ERROR_INVALID_CONTEXT (none),
// CUDA_ERROR_CONTEXT_IS_DESTROYED (released) or the context's sticky error.
CUresult current_device(lock&, int* device);

// Whether an object made in `generation` of `device`'s primary context may still be used: the
// same failures as current_device.
CUresult check_context(lock&, int device, uint64_t generation);
uint64_t context_generation(lock&, int device);
// The device of `ctx` (null: the current context), with the failures of check_context;
// CUDA_ERROR_INVALID_CONTEXT when it names no context.
CUresult resolve_context(lock&, CUcontext ctx, int* device);

// cuDevicePrimaryCtxRelease's bookkeeping: drops one reference to `device`'s primary context
// (CUDA_ERROR_INVALID_CONTEXT when it has none). When that was the last, the generation moves on,
// so the context's streams, events and allocations are dead from now, and `*dying` is the old
// generation, for the caller to tear down; else `*dying` stays empty.
CUresult drop_primary_reference(lock&, int device, std::optional<uint64_t>* dying);

CUresult sticky_error(int device);
// Records `error` as the device's sticky error unless one is recorded already.
void raise_sticky_error(int device, CUresult error);
void clear_sticky_error(int device);

}  // namespace tagmem::emu
