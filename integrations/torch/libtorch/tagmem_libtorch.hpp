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
// Limits (PyTorch's pluggable allocator API): torch's memory statistics are unavailable (they
// throw), c10::cuda::CUDACachingAllocator::emptyCache() does nothing (use tagmem::empty_cache()),
// and recordStream() is not tracked, so a tensor freed while another stream still uses it must be
// synchronised by the caller.
#pragma once

#include "tagmem/tagmem.hpp"

namespace tagmem::libtorch {

// Routes every CUDA allocation of the process through tagmem (see above). Thread-safe.
void install();

// Whether install() has run in this process.
bool installed() noexcept;

}  // namespace tagmem::libtorch
