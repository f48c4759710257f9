// proc_address.hpp — wrapping the driver's cuGetProcAddress, and what dlsym hands out for
// driver symbols.
//
// NCCL links the CUDA runtime statically; that runtime opens libcuda, asks dlsym for
// "cuGetProcAddress_v2" (or "cuGetProcAddress") and gets every other entry point through it.
// The shim's dlsym gives recorded callers (shim_config.hpp) a wrapped cuGetProcAddress, whose
// answers are the wrappers of driver_wrappers.hpp for the names they cover.
#pragma once

#include "real_symbols.hpp"  // TAGMEM_PRELOAD_EARLY

namespace tagmem::preload {

// Whether dlsym/dlvsym must look at `name` (a driver symbol the shim may wrap). Cheap, lock-
// and allocation-free: called for every dlsym in the process.
TAGMEM_PRELOAD_EARLY bool driver_symbol_of_interest(const char* name) noexcept;

// What dlsym returns for `name` resolved to `real`, asked by code at `caller`.
void* wrap_dlsym_result(const char* name, void* real, const void* caller);

}  // namespace tagmem::preload
