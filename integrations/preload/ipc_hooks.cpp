// ipc_hooks.cpp — cudaIpcGetMemHandle, cudaIpcOpenMemHandle and cudaIpcCloseMemHandle of a
// dynamically linked CUDA runtime, answered by tagmem for tagmem's memory (Note [ipc] in
// allocator/handoff/ipc_server.hpp) and passed through otherwise.
//
// Memory the shim routed to tagmem is virtual-memory memory, which has no legacy IPC handle:
// CUDA's cudaIpcGetMemHandle fails on it, and with it PyTorch's CUDA tensor sharing. So for an
// address inside a tagmem allocation, cudaIpcGetMemHandle exports the whole allocation (legacy
// IPC names the allocation that holds the address, and the opener gets its start) and writes the
// 64-byte tagmem IPC handle into the cudaIpcMemHandle_t, which has the same size.
// cudaIpcOpenMemHandle of a handle that starts with tagmem's magic opens it through the job's
// socket (the opener must run with the shim, or have loaded libtagmem, and belong to the same
// user and job); any other handle goes to the runtime. cudaIpcCloseMemHandle closes what
// tagmem opened and passes everything else on. Errors keep the runtime's vocabulary: a refused
// or failed open is cudaErrorInvalidResourceHandle (CUDA's answer to a handle it cannot open),
// a bad argument cudaErrorInvalidValue; TAGMEM_PRELOAD_LOG prints tagmem's message.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "real_symbols.hpp"
#include "reentry_guard.hpp"
#include "runtime_next.hpp"
#include "shim_config.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::preload {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(tagmem_ipc_handle));

using get_handle_fn = cudaError_t (*)(cudaIpcMemHandle_t*, void*);
using open_handle_fn = cudaError_t (*)(void**, cudaIpcMemHandle_t, unsigned int);
using close_handle_fn = cudaError_t (*)(void*);

constexpr unsigned char kMagic[4] = {'T', 'M', 'I', 'P'};  // ipc_messages.hpp, little-endian

cudaError_t report(const char* call, tagmem_status s, cudaError_t e) {
  if (config().log) {
    std::fprintf(stderr, "[tagmem preload] %s: %s: %s\n", call, tagmem_status_string(s),
                 tagmem_last_error());
  }
  return e;
}

}  // namespace
}  // namespace tagmem::preload

using namespace tagmem::preload;

extern "C" __attribute__((visibility("default"))) cudaError_t cudaIpcGetMemHandle(
    cudaIpcMemHandle_t* handle, void* ptr) {
  if (!reentry_guard::inside() && handle && ptr) {
    reentry_guard guard;
    void* base = nullptr;
    size_t size = 0;
    if (tagmem_pointer_info(ptr, nullptr, 0, nullptr, &base, &size) == TAGMEM_SUCCESS) {
      tagmem_ipc_handle h{};
      const tagmem_status s = tagmem_ipc_export(base, size, &h);
      if (s != TAGMEM_SUCCESS) return report("cudaIpcGetMemHandle", s, cudaErrorInvalidValue);
      std::memcpy(handle, h.bytes, sizeof h.bytes);
      return cudaSuccess;
    }
  }
  TAGMEM_NEXT(get_handle_fn, "cudaIpcGetMemHandle");
  return real(handle, ptr);
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaIpcOpenMemHandle(
    void** ptr, cudaIpcMemHandle_t handle, unsigned int flags) {
  if (!reentry_guard::inside() && ptr && std::memcmp(handle.reserved, kMagic, sizeof kMagic) == 0) {
    reentry_guard guard;
    tagmem_ipc_handle h{};
    std::memcpy(h.bytes, handle.reserved, sizeof h.bytes);
    size_t bytes = 0;
    const tagmem_status s = tagmem_ipc_open(&h, ptr, &bytes, nullptr);
    if (s == TAGMEM_SUCCESS) return cudaSuccess;
    return report("cudaIpcOpenMemHandle", s,
                  s == TAGMEM_ERROR_INVALID_ARGUMENT ? cudaErrorInvalidValue
                                                     : cudaErrorInvalidResourceHandle);
  }
  TAGMEM_NEXT(open_handle_fn, "cudaIpcOpenMemHandle");
  return real(ptr, handle, flags);
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  if (!reentry_guard::inside() && ptr) {
    reentry_guard guard;
    if (tagmem_ipc_close(ptr) == TAGMEM_SUCCESS) return cudaSuccess;
  }
  TAGMEM_NEXT(close_handle_fn, "cudaIpcCloseMemHandle");
  return real(ptr);
}
