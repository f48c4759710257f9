// host_pinning.hpp — how the host store pins memory, and pinning spread over threads.
//
// Note [pinning method]: pinning is CPU-bound (the kernel faults in, zeroes and locks every
// page) and costs far more than copying through the memory. The candidates are measured side by
// side by benchmarks/pinning_bench.cpp on a GPU (docs/performance.md, "Pinning"):
//  - register:       mmap, advise transparent huge pages, fault the pages in by touching them,
//                    cuMemHostRegister(PORTABLE). The default: touching parallelises, and huge
//                    pages make both the faults and the driver's page walk 512x fewer.
//  - register_small: the same without the huge-page advice (for kernels where THP hurts).
//  - host_alloc:     cuMemHostAlloc(PORTABLE), the driver doing everything itself.
// TAGMEM_HOST_PIN=register|register_small|host_alloc picks one at init. Whatever the method, a
// large request is cut into slabs pinned by several threads at once (TAGMEM_HOST_PIN_THREADS,
// default min(cores, 16)); each becomes a slab of the store.
//
// Note [unpin keeps what it cannot release]: a slab is unmapped only after the driver gave it
// back. When cuMemHostUnregister (or cuMemFreeHost, or the context switch before either) fails,
// the driver may still hold the pages registered and copy through them; unmapping them then would
// pull memory from under the driver, and a later mapping at that address could not be pinned.
// So unpin_slab leaves such a slab exactly as it was (pinned, mapped, usable) and reports the
// failed call; the caller keeps it (host_store::trim) or, with nowhere to report (a destructor),
// leaves it pinned for the life of the process.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>

namespace tagmem {

enum class pin_method { register_huge, register_small, host_alloc };

// TAGMEM_HOST_PIN (default register). Throws INVALID_ARGUMENT on an unknown name.
pin_method pin_method_from_env();
const char* pin_method_name(pin_method how) noexcept;
// TAGMEM_HOST_PIN_THREADS, else min(hardware threads, 16); at least 1.
unsigned pin_threads_from_env();

struct pinned_slab {
  char* base = nullptr;
  std::size_t size = 0;
};

// The outcome of unpinning one slab: success, or the driver call that failed and its result.
struct unpin_result {
  CUresult result = CUDA_SUCCESS;
  const char* call = nullptr;  // the entry point that failed ("cuMemHostUnregister", ...)
  bool ok() const noexcept { return result == CUDA_SUCCESS; }
};

// Pins `bytes` (a multiple of 2 MiB) as one slab, with `context` current. Throws
// HOST_OUT_OF_MEMORY or DRIVER with nothing left pinned or mapped.
pinned_slab pin_slab(std::size_t bytes, pin_method how, CUcontext context);
// Unpins and unmaps a slab from pin_slab, with `context` current. On failure the slab stays
// pinned and mapped, as it was (Note [unpin keeps what it cannot release]). Thread-safe.
[[nodiscard]] unpin_result unpin_slab(const pinned_slab& r, pin_method how,
                                      CUcontext context) noexcept;

// Pins `bytes` as slabs of at least `min_slab` bytes (2 MiB multiples), up to `threads`
// slabs at a time on as many threads, handing each pinned slab to `done` as soon as it is
// ready (from the thread that pinned it). Pieces that fail are not handed out; the first
// failure is rethrown after every thread has finished. A slab `done` throws for is unpinned
// again (left pinned, and lost, if that fails too).
void pin_parallel(std::size_t bytes, std::size_t min_slab, unsigned threads, pin_method how,
                  CUcontext context, const std::function<void(pinned_slab)>& done);

// Unpins slabs on up to `threads` threads, each as unpin_slab does; stores slab i's outcome
// in results[i] when `results` is not null. Returns how many failed (those stay pinned).
std::size_t unpin_parallel(const pinned_slab* slabs, std::size_t count, unsigned threads,
                           pin_method how, CUcontext context,
                           unpin_result* results = nullptr) noexcept;

}  // namespace tagmem
