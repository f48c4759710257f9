// kernel_copy.hpp — host-to-device copies run by the GPU's SMs: the copy kernel of one device.
//
// Note [copy kernel]: a copy engine's host-to-device copy is slowed for a while after much device
// memory went back to the driver (Note [release aftermath] in release_clock.hpp); the same bytes
// read by a kernel from pinned host memory, through its device mapping, cross the same link at
// nearly its full rate (docs/performance.md, "After a release"). tagmem_h2d_copy
// (kernel_copy.cu) is such a kernel. copy_queue gives it pieces beside the copy engines, each lane
// taking the next piece when it has room, so the faster one copies more: while the process is
// after a release (TAGMEM_COPY_KERNEL=after_release, the default), on every reload (`always`), or
// never (`off`).
// The kernel needs unified addressing, a device that reads registered host memory at its host
// address (CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM; the host store registers
// with CU_MEMHOSTREGISTER_DEVICEMAP) and an image that this device can run. When any of that is
// missing, or loading fails, the copy engines do every copy; TAGMEM_LOG=info says why, once.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace tagmem {

class kernel_copy {
 public:
  kernel_copy() = default;
  kernel_copy(const kernel_copy&) = delete;
  kernel_copy& operator=(const kernel_copy&) = delete;

  // Loads the kernel and creates its stream in the current context (the device's); returns
  // whether the kernel can be used. Called once, before other threads can see the object
  // (device.cpp does it when it sets the device up); a failure is logged and leaves stream() null.
  bool load(CUdevice dev, int ordinal) noexcept;
  // Queues the copy of `bytes` from pinned host memory at `src` to `dst` on stream(). Only after
  // load() returned true. Throws DRIVER.
  void launch(CUdeviceptr dst, const void* src, std::size_t bytes);
  // Null unless loaded.
  CUstream stream() const noexcept { return stream_; }

  // Destroys the stream and unloads the module; the device's context must be current.
  void unload() noexcept;

 private:
  void load_or_throw(CUdevice dev, int ordinal);

  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  CUstream stream_ = nullptr;
  unsigned grid_ = 0;
};

}  // namespace tagmem
