// driver.hpp — the only door to CUDA: a table of driver entry points loaded at run time.
//
// Contract. load() opens TAGMEM_LIBCUDA (a path) if set, else "libcuda.so.1", resolves
// cuGetProcAddress_v2 with the symbol resolver (dlsym unless the preload shim installed its own,
// so the shim never re-enters itself) and asks it for every entry in entry_points.def at the
// toolkit's CUDA_VERSION. A missing library or entry point is TAGMEM_ERROR_NO_DRIVER; nothing
// falls back to another driver. api() returns the loaded table and may be called from any
// thread once load() has succeeded. Nothing here links libcuda or libcudart at build time.
//
// Every call site wraps a driver call in TAGMEM_CU(name, args...), which throws tagmem::error
// naming the call and the CUDA error on failure: CUDA_ERROR_OUT_OF_MEMORY becomes
// TAGMEM_ERROR_OUT_OF_MEMORY, everything else TAGMEM_ERROR_DRIVER.
#pragma once

#include <cuda.h>

#include <string>

#include "base/error.hpp"

namespace tagmem::driver {

struct table {
#define TAGMEM_DRIVER_ENTRY(name) decltype(&::name) name = nullptr;
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
};

// Resolves a symbol in a dlopen()ed handle; the preload shim installs the real dlsym here.
using symbol_resolver = void* (*)(void* handle, const char* name);
void set_symbol_resolver(symbol_resolver resolver);

// Loads the driver once (thread-safe); later calls return at once. Throws NO_DRIVER.
void load();
// The library path load() used ("libcuda.so.1" or TAGMEM_LIBCUDA).
const std::string& library_path();

const table& api() noexcept;

// Builds the message for a failed call and throws. `call` is the entry point's base name.
[[noreturn]] void throw_error(CUresult result, const char* call);

inline void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) throw_error(result, call);
}

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", robust against an unloaded driver.
std::string describe(CUresult result);

}  // namespace tagmem::driver

#define TAGMEM_CU(name, ...) \
  ::tagmem::driver::check(::tagmem::driver::api().name(__VA_ARGS__), #name)
