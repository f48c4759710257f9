// cuda_calls.hpp — the few CUDA driver calls the demo makes itself, loaded at run time.
//
// An application would link libcuda (or use the CUDA runtime) for these. The demo loads them
// from the library tagmem itself loads (TAGMEM_LIBCUDA, else libcuda.so.1; opening the same path
// again shares the driver's state), so that it builds without a driver and runs on the emulated
// one: it uses tagmem only through its public header, as a user's program would.
#pragma once

#include <cuda.h>

#include <string>

namespace tagmem::demo {

struct cuda_calls {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuMemHostAlloc) host_alloc = nullptr;
  decltype(&::cuMemFreeHost) free_host = nullptr;
  decltype(&::cuMemcpyHtoD) copy_to_device = nullptr;
  decltype(&::cuMemcpyDtoH) copy_to_host = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
};

// Loads them (once) from TAGMEM_LIBCUDA or libcuda.so.1. Throws std::runtime_error.
const cuda_calls& cuda();

// Throws std::runtime_error naming `what` and the driver's words unless `r` is CUDA_SUCCESS.
void check_cuda(CUresult r, const char* what);

}  // namespace tagmem::demo
