// device_wait.hpp — the device-wide wait that CUDA's cudaFree performs before memory can be
// used again (Note [cudaFree waits] in runtime_hooks.cpp).
#pragma once

#include <cuda.h>

namespace tagmem::preload {

// Blocks until all work queued in `device`'s primary context has finished, through tagmem's
// driver table (loaded: tagmem has served an allocation before anything is freed). The calling
// thread's current context is left as it was. Returns the driver's error, e.g. the context's
// sticky error after a faulting kernel, or CUDA_ERROR_INVALID_VALUE for a bad ordinal. Never
// throws; thread-safe.
CUresult wait_for_device(int device) noexcept;

}  // namespace tagmem::preload
