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

#include <atomic>
#include <mutex>

namespace tagmem {

struct backup_piece;

class kernel_copy {
 public:
  kernel_copy() = default;
  kernel_copy(const kernel_copy&) = delete;
  kernel_copy& operator=(const kernel_copy&) = delete;

  // Loads the kernel and creates its stream on the first call (device.cpp makes it when the
  // device is set up), in the current context (the device's); returns whether the kernel can be
  // used. A failure is not tried again. Thread-safe.
  bool ready(CUdevice dev, int ordinal) noexcept;
  // Queues the copy of `p` (host to device) on stream(). Only after ready() returned true.
  // Throws DRIVER.
  void launch(const backup_piece& p);
  // Null until loaded.
  CUstream stream() const noexcept { return stream_.load(std::memory_order_acquire); }

  // Destroys the stream and unloads the module; the device's context must be current.
  void unload() noexcept;

 private:
  void load(CUdevice dev, int ordinal);

  std::once_flag once_;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::atomic<CUstream> stream_{nullptr};  // read by threads that wait for the copy streams
  unsigned grid_ = 0;
};

}  // namespace tagmem
