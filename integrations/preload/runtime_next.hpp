// runtime_next.hpp — the CUDA runtime's own function behind one of the shim's interposers,
// looked up once per interposer (next_runtime_symbol, real_symbols.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "real_symbols.hpp"

namespace tagmem::preload {

template <class F>
F next(const char* name, const void* caller) {
  static_assert(sizeof(F) == sizeof(void*));
  return reinterpret_cast<F>(next_runtime_symbol(name, caller));
}

}  // namespace tagmem::preload

// In an interposer's body: `real` is the runtime's `name` of type `type`, or the interposer
// returns cudaErrorInitializationError when there is none.
#define TAGMEM_NEXT(type, name)                                              \
  static std::atomic<type> real_{nullptr};                                   \
  type real = real_.load();                                                  \
  if (!real) {                                                               \
    real = ::tagmem::preload::next<type>(name, __builtin_return_address(0)); \
    real_.store(real);                                                       \
  }                                                                          \
  if (!real) return cudaErrorInitializationError
