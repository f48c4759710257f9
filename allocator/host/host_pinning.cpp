// host_pinning.cpp — pinning methods and the threads that run them (Note [pinning method]).
#include "host/host_pinning.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/byte_math.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "observe/trace.hpp"
#include "options/options.hpp"

namespace tagmem {
namespace {

constexpr std::size_t kHuge = 2u << 20;

// A 2 MiB aligned anonymous mapping, so that huge pages can back all of it.
char* map_aligned(std::size_t bytes) {
  TAGMEM_EXPECTS(bytes <= kMaxAddressableBytes, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "cannot map " + std::to_string(bytes) + " bytes of host memory to pin");
  void* p =
      mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TAGMEM_EXPECTS(p != MAP_FAILED, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "cannot map " + std::to_string(bytes) + " bytes of host memory to pin");
  auto start = reinterpret_cast<std::uintptr_t>(p);
  auto aligned = round_up(start, kHuge);
  if (aligned > start) munmap(p, aligned - start);
  std::size_t tail = start + bytes + kHuge - (aligned + bytes);
  if (tail) munmap(reinterpret_cast<char*>(aligned + bytes), tail);
  return reinterpret_cast<char*>(aligned);
}

// Runs body(i) for i in [0, n) on up to `threads` threads, each taking the next index.
template <class F>
void for_each_index(std::size_t n, unsigned threads, F&& body) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  std::vector<std::thread> pool;
  std::size_t extra = std::min<std::size_t>(threads, n) - (n ? 1 : 0);
  try {
    pool.reserve(extra);
    for (std::size_t i = 0; i < extra; ++i) pool.emplace_back(work);
  } catch (...) {  // fewer threads than asked: the ones running, and this one, do the rest
  }
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

pin_method pin_method_from_env() {
  // In the order of TAGMEM_HOST_PIN's choices (options.def).
  static constexpr pin_method kMethods[] = {pin_method::register_huge, pin_method::register_small,
                                            pin_method::host_alloc};
  return kMethods[option_choice(option::HOST_PIN)];
}

const char* pin_method_name(pin_method how) noexcept {
  switch (how) {
    case pin_method::register_huge:
      return "register";
    case pin_method::register_small:
      return "register_small";
    case pin_method::host_alloc:
      return "host_alloc";
  }
  return "?";
}

unsigned pin_threads_from_env() {
  if (option_env(option::HOST_PIN_THREADS))
    return static_cast<unsigned>(option_number(option::HOST_PIN_THREADS));
  return std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
}

pinned_slab pin_slab(std::size_t bytes, pin_method how, CUcontext context) {
  trace::span span("pin", nullptr, bytes, trace::effect::pinned_up);
  const auto& api = driver::api();
  context_guard guard(context);
  if (how == pin_method::host_alloc) {
    void* p = nullptr;
    CUresult r =
        api.cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r != CUDA_SUCCESS) {
      fail(r == CUDA_ERROR_OUT_OF_MEMORY ? TAGMEM_ERROR_HOST_OUT_OF_MEMORY : TAGMEM_ERROR_DRIVER,
           "cuMemHostAlloc of " + std::to_string(bytes) +
               " bytes for the pinned host store failed: " + driver::describe(r));
    }
    return {static_cast<char*>(p), bytes};
  }
  char* base = map_aligned(bytes);
  if (how == pin_method::register_huge) madvise(base, bytes, MADV_HUGEPAGE);  // advice only
  // Fault the pages in here (one write per 4 KiB page) rather than inside the driver's single
  // registering thread.
  for (std::size_t off = 0; off < bytes; off += 4096) base[off] = 0;
  CUresult r = api.cuMemHostRegister(base, bytes,
                                     CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    munmap(base, bytes);
    fail(r == CUDA_ERROR_OUT_OF_MEMORY ? TAGMEM_ERROR_HOST_OUT_OF_MEMORY : TAGMEM_ERROR_DRIVER,
         "cuMemHostRegister of " + std::to_string(bytes) +
             " bytes for the pinned host store failed: " + driver::describe(r));
  }
  return {base, bytes};
}

unpin_result unpin_slab(const pinned_slab& r, pin_method how, CUcontext context) noexcept {
  const auto& api = driver::api();
  CUcontext previous = nullptr;
  if (CUresult e = api.cuCtxGetCurrent(&previous); e != CUDA_SUCCESS) return {e, "cuCtxGetCurrent"};
  if (previous != context) {
    if (CUresult e = api.cuCtxSetCurrent(context); e != CUDA_SUCCESS) {
      return {e, "cuCtxSetCurrent"};
    }
  }
  unpin_result out;
  if (how == pin_method::host_alloc) {
    if (CUresult e = api.cuMemFreeHost(r.base); e != CUDA_SUCCESS) out = {e, "cuMemFreeHost"};
  } else if (CUresult e = api.cuMemHostUnregister(r.base); e != CUDA_SUCCESS) {
    // Maybe still registered: stays mapped (Note [unpin keeps what it cannot release]).
    out = {e, "cuMemHostUnregister"};
  } else {
    munmap(r.base, r.size);
  }
  // A failed restore is no failure of the unpin: the thread is left in `context` (as
  // context_guard does).
  if (previous != context) api.cuCtxSetCurrent(previous);
  return out;
}

void pin_parallel(std::size_t bytes, std::size_t min_slab, unsigned threads, pin_method how,
                  CUcontext context, const std::function<void(pinned_slab)>& done) {
  if (bytes == 0) return;
  threads = std::max(threads, 1u);
  min_slab = round_up_checked(std::max(min_slab, kHuge), kHuge, TAGMEM_ERROR_INVALID_ARGUMENT,
                              "a pinned slab");
  bytes = round_up_checked(bytes, kHuge, TAGMEM_ERROR_HOST_OUT_OF_MEMORY, "pinning host memory");
  // As many slabs as threads, none smaller than min_slab.
  std::size_t slabs = std::clamp<std::size_t>(bytes / min_slab, 1, threads);
  std::size_t slab = round_up((bytes + slabs - 1) / slabs, kHuge);
  std::mutex error_mutex;
  std::exception_ptr first_error;
  for_each_index(slabs, threads, [&](std::size_t i) {
    std::size_t offset = i * slab;
    if (offset >= bytes) return;
    std::size_t n = std::min(slab, bytes - offset);
    try {
      pinned_slab r = pin_slab(n, how, context);
      try {
        done(r);
      } catch (...) {
        (void)unpin_slab(r, how, context);  // on failure it stays pinned: nowhere to keep it
        throw;
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  });
  if (first_error) std::rethrow_exception(first_error);
}

std::size_t unpin_parallel(const pinned_slab* slabs, std::size_t count, unsigned threads,
                           pin_method how, CUcontext context, unpin_result* results) noexcept {
  std::atomic<std::size_t> failed{0};
  for_each_index(count, threads, [&](std::size_t i) {
    unpin_result r = unpin_slab(slabs[i], how, context);
    if (!r.ok()) failed.fetch_add(1);
    if (results) results[i] = r;
  });
  return failed.load();
}

}  // namespace tagmem
