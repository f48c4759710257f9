// faults.hpp — per-entry-point call counting and fault injection.
//
// Note [emu fault injection]: tagmem_emu_fail_call(name, n, error) makes the n-th call from now
// of one entry point (or of any, with a null name) return `error`. The check runs first in every
// entry point (TAGMEM_EMU_ENTRY in api.hpp), before arguments are read or state is touched, so
// an injected failure has no side effect at all: exactly what a caller's error path must cope
// with. Counting the calls lets a test sweep n over every driver call a workload makes. Calls
// that the emulator makes to itself go through internal functions and are never counted.
#pragma once

#include <cuda.h>

namespace tagmem::emu {

enum class entry : int {
#define TAGMEM_DRIVER_ENTRY(name) name##_,
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
  count_
};

// Counts one call of `e`; returns the injected error due on this call, or CUDA_SUCCESS.
CUresult on_call(entry e);

}  // namespace tagmem::emu
