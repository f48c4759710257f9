// context_guard.hpp — makes a CUDA context current on the calling thread for a scope.
//
// Every component that calls the driver on behalf of a device (its arenas, the host store's
// pinning, the offload pipeline, the NCCL integration) switches to that device's context first
// and back after, so that a caller's own current context is never changed by tagmem.
#pragma once

#include <cuda.h>

namespace tagmem {

// Makes `ctx` current on this thread for the guard's lifetime and restores the previous context
// after. Throws DRIVER when the switch fails; a failed restore is ignored (the thread stays in
// `ctx`).
class context_guard {
 public:
  explicit context_guard(CUcontext ctx);
  ~context_guard();
  context_guard(const context_guard&) = delete;
  context_guard& operator=(const context_guard&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace tagmem
