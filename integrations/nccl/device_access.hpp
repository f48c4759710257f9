// device_access.hpp — the driver-side helpers pause and resume need: each device's primary
// context and one copy stream per device, and the pinned host store that holds released bytes.
//
// Everything here uses tagmem's own driver table (driver::api(), loaded with the real dlsym per
// Note [symbol resolver]), never the application's wrapped functions. The host store is created
// once and kept for the life of the process, so repeated pause/resume cycles reuse pinned pages
// (Note [pin once] in host_store.hpp); released bytes are copied in 64 MiB pieces, all queued on
// the device's copy stream before any is waited for.
#pragma once

#include <cuda.h>

#include "host_store.hpp"

namespace tagmem::nccl {

// Loads tagmem's driver table (once). Throws NO_DRIVER.
void ensure_driver();

// The primary context of `ordinal`, retained on first use and kept. Throws DRIVER.
CUcontext primary_context(int ordinal);

// Makes a device's primary context current for the guard's life.
class device_scope {
 public:
  explicit device_scope(int ordinal);
  ~device_scope();
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

// A non-blocking stream of `ordinal` for backup copies, created on first use.
CUstream copy_stream(int ordinal);

// The pinned host store for backups; nullptr until the first pause needs it.
host_store* existing_backup_store() noexcept;
host_store& backup_store(int ordinal);

// Queues copies between device range [va, va + bytes) and the host extents, in order.
void queue_to_host(const meta_vector<host_extent>& extents, CUdeviceptr va, CUstream stream);
void queue_to_device(const meta_vector<host_extent>& extents, CUdeviceptr va, CUstream stream);

}  // namespace tagmem::nccl
