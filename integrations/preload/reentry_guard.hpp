// reentry_guard.hpp — keeps the shim from running its own interposers.
//
// While a thread is inside the shim (handling a wrapped call, loading tagmem's driver, running
// tagmem), every interposer it reaches again — dlsym, cuGetProcAddress, a driver wrapper,
// cudaMalloc — passes straight through to the real function. The depth lives in initial-exec
// TLS, which needs no allocation or lock on first touch (the shim is loaded at start-up, so
// static TLS is available to it).
#pragma once

#include "real_symbols.hpp"  // TAGMEM_PRELOAD_EARLY

namespace tagmem::preload {

inline __thread int t_shim_depth __attribute__((tls_model("initial-exec"))) = 0;

class reentry_guard {
 public:
  reentry_guard() noexcept { ++t_shim_depth; }
  ~reentry_guard() { --t_shim_depth; }
  reentry_guard(const reentry_guard&) = delete;
  reentry_guard& operator=(const reentry_guard&) = delete;

  // On the path of every dlsym call (dl_route.cpp).
  TAGMEM_PRELOAD_EARLY static bool inside() noexcept { return t_shim_depth > 0; }
};

}  // namespace tagmem::preload
