// runtime_hooks.cpp — cudaMalloc, cudaFree, cudaMallocAsync and cudaFreeAsync of a dynamically
// linked CUDA runtime (PyTorch's), routed to tagmem or passed through.
//
// An allocation goes to tagmem when the calling thread is inside a tag scope
// (tagmem_push_tag), into that tag, or else when TAGMEM_PRELOAD_TAG names a default tag, unless
// the thread overrode the decision (thread_routing.hpp); every other call goes to the runtime's
// own function untouched. The device is the runtime's current
// one (cudaGetDevice), the stream the one given (the legacy default stream for cudaMalloc).
// A free goes to tagmem when the pointer is the start of a tagmem allocation, to the runtime
// otherwise; until tagmem has served any allocation no free is checked at all, so a process
// that never uses a tag pays nothing. Statically linked runtimes (NCCL's) never call these:
// their allocations are caught at the driver (driver_wrappers.hpp).
//
// Note [cudaFree waits]: CUDA's cudaFree synchronizes the device before the memory can be used
// again, and callers rely on it: PyTorch's caching allocator hands a block freed on a side
// stream, whose kernels may still be running, to cudaFree in empty_cache() without recording
// any event. tagmem_free is stream-ordered instead (another stream may reuse the block as soon
// as the given stream's work is done, and the given stream at once), so freeing with the null
// stream would let a new cudaMalloc hand out memory that old kernels still write. cudaFree
// therefore first waits for every context it could matter to — the device that owns the
// allocation and the runtime's current device — and frees only once they are idle; if a wait
// fails (a sticky error), the memory is not freed and the error is returned, as cudaFree
// returns errors of earlier asynchronous work. cudaFreeAsync is stream-ordered in CUDA too, and
// tagmem_free(ptr, stream) gives exactly that order; a later cudaMalloc (the legacy stream) that
// reuses such memory waits on the host for that stream's work, so its result is usable on any
// stream, as CUDA's is (Note [stream-ordered reuse] in block_pool.hpp). cudaFreeHost is not
// interposed (pinned host memory stays the runtime's), so it keeps CUDA's own behaviour.
//
// Errors keep the runtime's vocabulary: out of memory (also a tag that is offloaded, which a
// caching allocator such as PyTorch's treats like any out-of-memory, and a size larger than the
// device, which tagmem calls a bad argument but CUDA's cudaMalloc reports as out of memory, so
// that PyTorch raises OutOfMemoryError and code that searches for the largest batch that fits
// catches it) is cudaErrorMemoryAllocation, a bad argument or unknown pointer
// cudaErrorInvalidValue, anything else cudaErrorUnknown; tagmem's message is printed once per
// thread and kind when TAGMEM_PRELOAD_LOG is set.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>

#include "api/runtime.hpp"
#include "real_symbols.hpp"
#include "reentry_guard.hpp"
#include "runtime_next.hpp"
#include "shim_config.hpp"
#include "tagmem/tagmem.h"
#include "tagmem/tagmem_preload.h"
#include "thread_routing.hpp"

namespace tagmem::preload {
namespace {

using malloc_fn = cudaError_t (*)(void**, size_t);
using free_fn = cudaError_t (*)(void*);
using malloc_async_fn = cudaError_t (*)(void**, size_t, cudaStream_t);
using free_async_fn = cudaError_t (*)(void*, cudaStream_t);
using get_device_fn = cudaError_t (*)(int*);

std::atomic<bool> g_served{false};  // tagmem has served at least one allocation

int runtime_device(const void* caller) {
  static std::atomic<get_device_fn> get{nullptr};
  get_device_fn f = get.load();
  if (!f) {
    f = next<get_device_fn>("cudaGetDevice", caller);
    get.store(f);
  }
  int device = 0;
  if (f && f(&device) == cudaSuccess) return device;
  return TAGMEM_CURRENT_DEVICE;
}

cudaError_t to_runtime_error(tagmem_status s) {
  if (s != TAGMEM_SUCCESS && config().log) {
    std::fprintf(stderr, "[tagmem preload] %s: %s\n", tagmem_status_string(s), tagmem_last_error());
  }
  switch (s) {
    case TAGMEM_SUCCESS:
      return cudaSuccess;
    case TAGMEM_ERROR_OUT_OF_MEMORY:
    case TAGMEM_ERROR_HOST_OUT_OF_MEMORY:
    case TAGMEM_ERROR_TAG_OFFLOADED:
      return cudaErrorMemoryAllocation;
    case TAGMEM_ERROR_INVALID_ARGUMENT:
    case TAGMEM_ERROR_UNKNOWN_POINTER:
      return cudaErrorInvalidValue;
    default:
      return cudaErrorUnknown;
  }
}

// Whether `size` is more than `device` has in all (tagmem refuses it as INVALID_ARGUMENT).
bool larger_than_device(size_t size, int device) {
  try {
    runtime::hold rt;
    return size > rt.dev(device).total_bytes();
  } catch (...) {
    return false;
  }
}

cudaError_t allocate(void** ptr, size_t size, cudaStream_t stream, const char* tag,
                     const void* caller) {
  reentry_guard guard;
  const int device = runtime_device(caller);
  tagmem_status s =
      tagmem_malloc_tagged(ptr, size, tag, device, reinterpret_cast<tagmem_stream>(stream));
  if (s == TAGMEM_SUCCESS) g_served.store(true, std::memory_order_relaxed);
  if (config().log) {
    std::fprintf(stderr, "[tagmem preload] cudaMalloc(%zu) -> tag '%s': %s\n", size, tag,
                 tagmem_status_string(s));
  }
  cudaError_t e = to_runtime_error(s);
  if (s == TAGMEM_ERROR_INVALID_ARGUMENT && larger_than_device(size, device))
    e = cudaErrorMemoryAllocation;  // CUDA's answer to a size no device memory can hold
  return e;
}

// The runtime numbers the errors a synchronize reports (sticky faults of earlier work) as the
// driver does.
cudaError_t wait_error(CUresult r) {
  if (config().log) std::fprintf(stderr, "[tagmem preload] cudaFree: device wait failed: %d\n", r);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : static_cast<cudaError_t>(r);
}

// Note [cudaFree waits]: the owner's device, and the runtime's current one if another.
CUresult wait_like_cuda_free(int owner, const void* caller) {
  if (CUresult r = runtime::synchronize_device(owner); r != CUDA_SUCCESS) return r;
  int current = runtime_device(caller);
  if (current != TAGMEM_CURRENT_DEVICE && current != owner)
    return runtime::synchronize_device(current);
  return CUDA_SUCCESS;
}

enum class free_order { device_wide, on_stream };

// 1: tagmem freed it; 0: not tagmem's; -1 with *err set: tagmem's but not freed.
int try_free(void* ptr, cudaStream_t stream, free_order order, const void* caller,
             cudaError_t* err) {
  if (!ptr || !g_served.load(std::memory_order_relaxed)) return 0;
  reentry_guard guard;
  void* base = nullptr;
  int device = 0;
  if (tagmem_pointer_info(ptr, nullptr, 0, &device, &base, nullptr) != TAGMEM_SUCCESS) return 0;
  if (base != ptr) {
    *err = cudaErrorInvalidValue;  // inside an allocation, not its start: the runtime says so too
    return -1;
  }
  if (order == free_order::device_wide) {
    if (CUresult r = wait_like_cuda_free(device, caller); r != CUDA_SUCCESS) {
      *err = wait_error(r);
      return -1;
    }
  }
  *err = to_runtime_error(tagmem_free(ptr, reinterpret_cast<tagmem_stream>(stream)));
  return 1;
}

}  // namespace

const char* routing_tag() {
  const int mode = thread_routing();
  if (mode == TAGMEM_PRELOAD_ROUTE_OFF) return nullptr;
  if (mode == TAGMEM_PRELOAD_ROUTE_ON || !scope_empty()) return current_tag();
  const std::string& t = config().default_tag;
  return t.empty() ? nullptr : t.c_str();
}

}  // namespace tagmem::preload

using namespace tagmem::preload;

extern "C" __attribute__((visibility("default"))) cudaError_t cudaMalloc(void** ptr, size_t size) {
  const void* caller = __builtin_return_address(0);
  if (!reentry_guard::inside() && ptr && size > 0) {
    if (const char* tag = routing_tag()) return allocate(ptr, size, nullptr, tag, caller);
  }
  TAGMEM_NEXT(malloc_fn, "cudaMalloc");
  return real(ptr, size);
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaMallocAsync(void** ptr,
                                                                              size_t size,
                                                                              cudaStream_t stream) {
  const void* caller = __builtin_return_address(0);
  if (!reentry_guard::inside() && ptr && size > 0) {
    if (const char* tag = routing_tag()) return allocate(ptr, size, stream, tag, caller);
  }
  TAGMEM_NEXT(malloc_async_fn, "cudaMallocAsync");
  return real(ptr, size, stream);
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaFree(void* ptr) {
  const void* caller = __builtin_return_address(0);
  cudaError_t err = cudaSuccess;
  if (!reentry_guard::inside() && try_free(ptr, nullptr, free_order::device_wide, caller, &err))
    return err;
  TAGMEM_NEXT(free_fn, "cudaFree");
  return real(ptr);
}

extern "C" __attribute__((visibility("default"))) cudaError_t cudaFreeAsync(void* ptr,
                                                                            cudaStream_t stream) {
  const void* caller = __builtin_return_address(0);
  cudaError_t err = cudaSuccess;
  if (!reentry_guard::inside() && try_free(ptr, stream, free_order::on_stream, caller, &err))
    return err;
  TAGMEM_NEXT(free_async_fn, "cudaFreeAsync");
  return real(ptr, stream);
}
