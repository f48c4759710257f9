// tagmem_libtorch.cpp — the libtorch global-mode installer (see tagmem_libtorch.hpp).
//
// The allocation function is a lambda over tagmem's C ABI rather than the entry points of
// libtagmem_torch_alloc.so, so failures can raise the c10 exception types PyTorch's own allocator
// raises (the plain entry points cannot see c10). The allocator object is kept for the process:
// PyTorch stores it in a global and frees through it until exit.
#include "tagmem_libtorch.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace tagmem::libtorch {
namespace {

std::mutex g_mutex;
std::atomic<bool> g_installed{false};

std::string failure(const char* what, tagmem_status status) {
  return std::string("tagmem: ") + what + ": " + tagmem_status_string(status) + ": " +
         tagmem_last_error();
}

void* allocate(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  void* p = nullptr;
  tagmem_status status = tagmem_malloc(&p, size, device, reinterpret_cast<tagmem_stream>(stream));
  if (status == TAGMEM_ERROR_OUT_OF_MEMORY) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, failure("allocation", status));
  }
  TORCH_CHECK(status == TAGMEM_SUCCESS, failure("allocation", status));
  return p;
}

void deallocate(void* p, size_t, int, cudaStream_t stream) {
  if (p == nullptr) return;
  tagmem_status status = tagmem_free(p, reinterpret_cast<tagmem_stream>(stream));
  if (status != TAGMEM_SUCCESS) {  // a deleter must not throw
    std::fprintf(stderr, "%s\n", failure("free", status).c_str());
  }
}

}  // namespace

void install() {
  std::lock_guard lock(g_mutex);
  if (g_installed.load()) return;
  auto* current = c10::cuda::CUDACachingAllocator::get();
  if (current != nullptr && current->initialized()) {
    throw api_error(TAGMEM_ERROR_INVALID_ARGUMENT,
                    "TAGMEM_ERROR_INVALID_ARGUMENT: tagmem::libtorch::install() must run before "
                    "CUDA initialises in PyTorch (before the first CUDA tensor); PyTorch's "
                    "allocator is already in use");
  }
  auto allocator = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(allocate, deallocate);
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  g_installed.store(true);
}

bool installed() noexcept { return g_installed.load(); }

}  // namespace tagmem::libtorch
