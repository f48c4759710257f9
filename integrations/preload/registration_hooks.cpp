// registration_hooks.cpp — ncclCommRegister and ncclCommDeregister of a dynamically linked NCCL,
// passed on and remembered for tagged memory (Note [nccl holds] in
// allocator/registry/nccl_holds.hpp).
//
// NCCL exports a registered buffer's memory to its peers lazily, at the first collective that
// uses it, and ends the peers' mappings in ncclCommDeregister of its last registration (the
// call returns once they unmapped). The driver calls show the export; only these calls show
// the registration's end. So tagmem keeps the registrations of tagged memory, and a part NCCL
// exported stops holding its tag once no registration covers it. Registrations made through a
// libnccl handle of the caller's own (dlsym on a dlopen'ed libnccl, ctypes) are not seen: their
// exports hold the tag for as long as the process runs, as a CUDA graph's registration does.
//
// A CUDA graph that captures a collective on a registered buffer takes its own reference to the
// registration inside NCCL, and the peers keep their mappings until the graph is destroyed. The
// shim sees neither, so once the process has begun a capture (cudaStreamBeginCapture and
// cudaStreamBeginCaptureToGraph of the dynamically linked runtime are interposed to notice it)
// and NCCL_GRAPH_REGISTER is not 0, a deregistration no longer ends an export's hold.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

#include "api/runtime.hpp"
#include "real_symbols.hpp"
#include "reentry_guard.hpp"
#include "runtime_next.hpp"

namespace {

using nccl_result = int;                     // ncclResult_t, an enum of int size
constexpr nccl_result kNcclSystemError = 2;  // ncclSystemError: no NCCL behind the shim
using register_fn = nccl_result (*)(void*, void*, std::size_t, void**);
using deregister_fn = nccl_result (*)(void*, void*);

std::atomic<bool> g_captured{false};  // a stream capture was begun in this process

// Whether a graph captured here may share a registration with ncclCommRegister's.
bool graphs_may_share() {
  if (!g_captured.load()) return false;
  const char* setting = std::getenv("NCCL_GRAPH_REGISTER");
  return !(setting && std::strcmp(setting, "0") == 0);
}

// NCCL's function behind the interposer, looked up until found (NCCL may be loaded later).
template <class F>
F next_nccl(std::atomic<F>& slot, const char* name, const void* caller) {
  F f = slot.load();
  if (!f) {
    f = reinterpret_cast<F>(tagmem::preload::next_runtime_symbol(name, caller));
    slot.store(f);
  }
  return f;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) nccl_result ncclCommRegister(void* comm,
                                                                               void* buff,
                                                                               std::size_t size,
                                                                               void** handle) {
  static std::atomic<register_fn> slot{nullptr};
  const register_fn real = next_nccl(slot, "ncclCommRegister", __builtin_return_address(0));
  if (!real) return kNcclSystemError;
  const nccl_result r = real(comm, buff, size, handle);
  if (r == 0 && handle && *handle && !tagmem::preload::reentry_guard::inside()) {
    tagmem::preload::reentry_guard guard;
    try {
      tagmem::runtime::nccl_hold::registered(comm, *handle, reinterpret_cast<CUdeviceptr>(buff),
                                             size);
    } catch (const std::bad_alloc&) {
      // Unrecorded: an export under it counts as a graph's, held for good (the safe side).
    }
  }
  return r;
}

extern "C" __attribute__((visibility("default"))) nccl_result ncclCommDeregister(void* comm,
                                                                                 void* handle) {
  static std::atomic<deregister_fn> slot{nullptr};
  const deregister_fn real = next_nccl(slot, "ncclCommDeregister", __builtin_return_address(0));
  if (!real) return kNcclSystemError;
  const nccl_result r = real(comm, handle);
  if (r == 0 && handle && !tagmem::preload::reentry_guard::inside()) {
    tagmem::preload::reentry_guard guard;
    tagmem::runtime::nccl_hold::deregistered(comm, handle, graphs_may_share());
  }
  return r;
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaStreamBeginCapture(
    cudaStream_t stream, cudaStreamCaptureMode mode) {
  using fn = cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode);
  TAGMEM_NEXT(fn, "cudaStreamBeginCapture");
  g_captured.store(true);  // before: the capture may register buffers at once
  return real(stream, mode);
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaStreamBeginCaptureToGraph(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    const cudaGraphEdgeData* dependency_data, size_t count, cudaStreamCaptureMode mode) {
  using fn = cudaError_t (*)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*,
                             const cudaGraphEdgeData*, size_t, cudaStreamCaptureMode);
  TAGMEM_NEXT(fn, "cudaStreamBeginCaptureToGraph");
  g_captured.store(true);
  return real(stream, graph, dependencies, dependency_data, count, mode);
}
