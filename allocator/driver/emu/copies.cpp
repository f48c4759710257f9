// copies.cpp — cuMemcpyHtoD/DtoH (synchronous), their Async forms, cuMemcpyDtoDAsync,
// cuMemsetD8Async, and cuLaunchKernel of the copy kernel (Note [emu kernels] in modules.cpp).
//
// A copy is checked twice. When it is called, its device ranges must be mapped with access for
// the stream's device (read for a source, write for a destination), else
// CUDA_ERROR_INVALID_VALUE — the real driver checks this at call time for asynchronous copies
// too (measured). When it executes, it moves at most copy_piece bytes at a time with the regions
// pinned (Note [emu pins]); a piece whose range has lost its mapping or access since the call
// stops the copy with the fault the real driver reports (Note [emu sticky errors]).
//
// Pageable host memory behaves as the real driver documents: an asynchronous host-to-device
// copy from it is staged into a private buffer before the call returns, so the caller may reuse
// its buffer at once; a device-to-host copy into it has completed when the call returns. With
// pinned memory (host_memory.hpp) both are truly asynchronous.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "address_space.hpp"
#include "api.hpp"
#include "contexts.hpp"
#include "emu_control.h"
#include "host_memory.hpp"
#include "modules.hpp"
#include "streams.hpp"
#include "test_hold.hpp"

namespace tagmem::emu {
namespace {

std::atomic<uint64_t> bytes_per_second{0};  // 0: unlimited

// tagmem_emu_hold_next_h2d_copy: the next host-to-device copy on a created stream waits.
test_hold& hold() {
  static test_hold h;
  return h;
}

enum class copy_kind { host_to_device, device_to_host, device_to_device, memset, kernel_from_host };

struct copy {
  copy_kind kind;
  uintptr_t dst = 0;
  uintptr_t src = 0;  // unused by memset
  size_t bytes = 0;
  unsigned char value = 0;  // memset only
  int device = 0;           // whose access counts

  bool dst_on_device() const { return kind != copy_kind::device_to_host; }
  bool src_on_device() const {
    return kind == copy_kind::device_to_host || kind == copy_kind::device_to_device;
  }
  // What the real driver reports when one faults (measured on an H200); a kernel's fault is an
  // illegal address.
  CUresult fault() const {
    return kind == copy_kind::host_to_device || kind == copy_kind::device_to_host
               ? CUDA_ERROR_LAUNCH_FAILED
               : CUDA_ERROR_ILLEGAL_ADDRESS;
  }
};

bool allowed(lock& held, const copy& c) {
  return (!c.dst_on_device() || accessible(held, c.dst, c.bytes, c.device, true)) &&
         (!c.src_on_device() || accessible(held, c.src, c.bytes, c.device, false));
}

bool pin_piece(lock& held, const copy& c, size_t offset, size_t n) {
  if (c.dst_on_device() && !pin(held, c.dst + offset, n, c.device, true)) return false;
  if (c.src_on_device() && !pin(held, c.src + offset, n, c.device, false)) {
    if (c.dst_on_device()) unpin(held, c.dst + offset, n);
    return false;
  }
  return true;
}

void unpin_piece(lock& held, const copy& c, size_t offset, size_t n) {
  if (c.dst_on_device()) unpin(held, c.dst + offset, n);
  if (c.src_on_device()) unpin(held, c.src + offset, n);
}

void throttle(size_t n) {
  const uint64_t rate = bytes_per_second.load(std::memory_order_relaxed);
  if (rate == 0) return;
  std::this_thread::sleep_for(std::chrono::nanoseconds(n * uint64_t{1000000000} / rate));
}

// Moves the bytes piece by piece; the copy's fault if a piece's range is no longer accessible.
CUresult execute(const copy& c) {
  if (c.kind == copy_kind::kernel_from_host) {  // the kernel reads host memory through its mapping
    lock held = take_lock();
    if (!is_pinned(held, c.src, c.bytes)) return c.fault();
  }
  for (size_t offset = 0; offset < c.bytes;) {
    const size_t n = std::min(copy_piece, c.bytes - offset);
    {
      lock held = take_lock();
      if (!pin_piece(held, c, offset, n)) return c.fault();
    }
    auto* dst = reinterpret_cast<unsigned char*>(c.dst + offset);
    if (c.kind == copy_kind::memset)
      std::memset(dst, c.value, n);
    else
      std::memcpy(dst, reinterpret_cast<const unsigned char*>(c.src + offset), n);
    {
      lock held = take_lock();
      unpin_piece(held, c, offset, n);
    }
    throttle(n);
    offset += n;
  }
  return CUDA_SUCCESS;
}

// A synchronous copy: on the NULL stream of the current context, errors returned directly.
CUresult run_now(copy c, const void* host) {
  {
    lock held = take_lock();
    if (CUresult r = current_device(held, &c.device); r != CUDA_SUCCESS) return r;
    if (c.bytes == 0) return CUDA_SUCCESS;
    if (host == nullptr || !allowed(held, c)) return CUDA_ERROR_INVALID_VALUE;
  }
  wait_idle(target{nullptr, c.device});
  const CUresult r = execute(c);
  if (r != CUDA_SUCCESS) raise_sticky_error(c.device, r);
  return r;
}

// An asynchronous copy or memset on `stream`; `host` is its host buffer, if any.
CUresult enqueue(copy c, const void* host, CUstream stream) {
  target where;
  bool pinned = true;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, stream, &where); r != CUDA_SUCCESS) return r;
    c.device = where.device;
    if (c.bytes == 0) return CUDA_SUCCESS;
    if (c.kind != copy_kind::device_to_device && c.kind != copy_kind::memset && host == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    if (!allowed(held, c)) return CUDA_ERROR_INVALID_VALUE;
    if (host != nullptr) pinned = is_pinned(held, reinterpret_cast<uintptr_t>(host), c.bytes);
  }
  std::shared_ptr<std::vector<unsigned char>> staging;
  if (c.kind == copy_kind::host_to_device && !pinned) {
    const auto* bytes = static_cast<const unsigned char*>(host);
    staging = std::make_shared<std::vector<unsigned char>>(bytes, bytes + c.bytes);
    c.src = reinterpret_cast<uintptr_t>(staging->data());
  }
  const bool held = c.kind == copy_kind::host_to_device && where.queue != nullptr && hold().take();
  submit(where, [c, staging, held]() -> CUresult {
    if (held) hold().wait();
    if (sticky_error(c.device) != CUDA_SUCCESS) return CUDA_SUCCESS;  // a dead context runs nothing
    return execute(c);
  });
  if (c.kind == copy_kind::device_to_host && !pinned) wait_idle(where);
  return CUDA_SUCCESS;
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace
}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  TAGMEM_EMU_ENTRY(cuMemcpyHtoD);
  return run_now(copy{copy_kind::host_to_device, dst, address(src), bytes}, src);
}

TAGMEM_EMU_EXPORT CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  TAGMEM_EMU_ENTRY(cuMemcpyDtoH);
  return run_now(copy{copy_kind::device_to_host, address(dst), src, bytes}, dst);
}

TAGMEM_EMU_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes,
                                             CUstream stream) {
  TAGMEM_EMU_ENTRY(cuMemcpyHtoDAsync);
  return enqueue(copy{copy_kind::host_to_device, dst, address(src), bytes}, src, stream);
}

TAGMEM_EMU_EXPORT CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes,
                                             CUstream stream) {
  TAGMEM_EMU_ENTRY(cuMemcpyDtoHAsync);
  return enqueue(copy{copy_kind::device_to_host, address(dst), src, bytes}, dst, stream);
}

TAGMEM_EMU_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                             CUstream stream) {
  TAGMEM_EMU_ENTRY(cuMemcpyDtoDAsync);
  return enqueue(copy{copy_kind::device_to_device, dst, src, bytes}, nullptr, stream);
}

TAGMEM_EMU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count,
                                           CUstream stream) {
  TAGMEM_EMU_ENTRY(cuMemsetD8Async);
  return enqueue(copy{copy_kind::memset, dst, 0, count, value}, nullptr, stream);
}

// The copy kernel's parameters, in order: source (pinned host), destination (device), bytes.
TAGMEM_EMU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned grid_x, unsigned grid_y,
                                          unsigned grid_z, unsigned block_x, unsigned block_y,
                                          unsigned block_z, unsigned shared_bytes, CUstream stream,
                                          void** params, void** extra) {
  TAGMEM_EMU_ENTRY(cuLaunchKernel);
  const uint64_t threads = uint64_t{block_x} * block_y * block_z;
  if (uint64_t{grid_x} * grid_y * grid_z == 0 || threads == 0 || threads > 1024 ||
      shared_bytes > (48u << 10) || params == nullptr || extra != nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  copy c{copy_kind::kernel_from_host, *static_cast<CUdeviceptr*>(params[1]),
         address(*static_cast<const void**>(params[0])),
         static_cast<size_t>(*static_cast<unsigned long long*>(params[2]))};
  target where;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, stream, &where); r != CUDA_SUCCESS) return r;
    if (!is_copy_kernel(held, f)) return CUDA_ERROR_INVALID_HANDLE;
    c.device = where.device;
  }
  if (c.bytes == 0) return CUDA_SUCCESS;
  submit(where, [c]() -> CUresult {
    if (sticky_error(c.device) != CUDA_SUCCESS) return CUDA_SUCCESS;  // a dead context runs nothing
    return execute(c);
  });
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT void tagmem_emu_set_copy_bytes_per_second(uint64_t rate) {
  bytes_per_second.store(rate, std::memory_order_relaxed);
}

TAGMEM_EMU_EXPORT void tagmem_emu_hold_next_h2d_copy(void) { hold().arm(); }

TAGMEM_EMU_EXPORT void tagmem_emu_release_held_copy(void) { hold().release(); }
