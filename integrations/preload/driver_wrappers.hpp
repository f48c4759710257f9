// driver_wrappers.hpp — the functions handed to recorded callers in place of driver entry
// points, and the table that says which name (at which version) gets which.
//
// Each wrapper has exactly the ABI cuGetProcAddress hands out for its name, enters the shim
// (reentry_guard) and calls the behaviour in integrations/nccl/interposed.cpp; re-entered from
// inside the shim it calls the driver's function directly. cuGetProcAddress itself is wrapped
// too, in both ABIs — Note [self lookup] in proc_address.cpp.
#pragma once

#include "real_symbols.hpp"  // TAGMEM_PRELOAD_EARLY

namespace tagmem::preload {

struct wrapped_entry {
  const char* name;  // as asked of cuGetProcAddress, or exported by libcuda for dlsym
  int min_version;   // cuGetProcAddress versions below it return another ABI: left alone
  void* wrapper;
  void (*capture)(void* real);  // remembers the driver's function (first one wins)
};

// The entry for a cuGetProcAddress name, or null.
const wrapped_entry* find_proc_entry(const char* name);
// The entry for a symbol exported by libcuda (dlsym names: "cuMemAlloc_v2", ...), or null.
TAGMEM_PRELOAD_EARLY const wrapped_entry* find_exported_entry(const char* name);

}  // namespace tagmem::preload
