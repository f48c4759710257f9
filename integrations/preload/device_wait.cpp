// device_wait.cpp — synchronizing a device's primary context (see header).
//
// The primary context is the one the CUDA runtime (and so PyTorch) queues its work in, and the
// one tagmem allocates in. The wait makes it current for its duration, as tagmem's own waits
// do, so that it means the same whether the driver's cuCtxSynchronize takes the context as an
// argument or acts on the current one.
#include "device_wait.hpp"

#include "driver/driver.hpp"

namespace tagmem::preload {

CUresult wait_for_device(int device) noexcept {
  const driver::table& d = driver::api();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (CUresult r = d.cuDeviceGet(&dev, device); r != CUDA_SUCCESS) return r;
  if (CUresult r = d.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) return r;
  CUcontext previous = nullptr;
  CUresult r = d.cuCtxGetCurrent(&previous);
  bool switched = false;
  if (r == CUDA_SUCCESS && previous != ctx) {
    r = d.cuCtxSetCurrent(ctx);
    switched = r == CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) r = d.cuCtxSynchronize(ctx);
  if (switched) d.cuCtxSetCurrent(previous);
  d.cuDevicePrimaryCtxRelease(dev);
  return r;
}

}  // namespace tagmem::preload
