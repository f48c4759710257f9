// tagmem_libtorch.hpp — tagmem for C++ programs that link libtorch: the global-mode installer.
//
// install() makes tagmem PyTorch's CUDA allocator through libtorch's pluggable-allocator C++ API
// (torch::cuda::CUDAPluggableAllocator), exactly what tagmem.torch.install() does from Python:
// every at::Tensor on a CUDA device is then a tagmem allocation in the calling thread's tag scope
// (tagmem::tag_scope; "default" outside any scope), and tagmem::offload / reload / swap act on
// whole tags while every tensor keeps its data_ptr(). Allocation failures raise c10 exceptions
// (c10::OutOfMemoryError when device memory ran out), as PyTorch's own allocator does.
//
// Call install() before CUDA initialises in PyTorch (before the first CUDA tensor). Later it
// throws tagmem::api_error (TAGMEM_ERROR_INVALID_ARGUMENT). Calling it again is harmless.
//
// What PyTorch's allocator API offers works as with PyTorch's own allocator: recordStream() is
// tracked (a block freed while a recorded stream still uses it is reused only after that stream's
// work queued at the free: stream_records.hpp), c10::cuda::CUDACachingAllocator::emptyCache()
// (torch.cuda.empty_cache()) calls tagmem_empty_cache() on every device tagmem uses, and
// getDeviceStats() (torch.cuda.memory_stats(), memory_allocated(), memory_reserved(),
// max_memory_allocated(), reset_peak_memory_stats()) reports allocations, allocated/active/
// requested bytes and tagmem's reserved bytes; per-pool (small/large) breakdowns, segment counts
// and inactive splits read 0. memory snapshots, cacheInfo and recordHistory still throw (PyTorch's
// pluggable allocator has no hook for them). install(false) leaves recordStream untracked, as
// PyTorch's bare pluggable allocator does (for comparison, and for tests that show it matters).
//
// Also callable from C (Python's tagmem.torch.install() uses it when this library is found):
//   int tagmem_libtorch_install(int track_record_streams, char* message, size_t length);
//       // tagmem_status; the message on error
//   size_t tagmem_libtorch_joined_frees(void);  // frees so far that waited for recorded streams
#pragma once

#include "tagmem/tagmem.hpp"

namespace tagmem::libtorch {

// Routes every CUDA allocation of the process through tagmem (see above). Thread-safe.
void install(bool track_record_streams = true);

// Whether install() has run in this process.
bool installed() noexcept;

}  // namespace tagmem::libtorch
