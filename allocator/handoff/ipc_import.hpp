// ipc_import.hpp — tagged memory of another process mapped here: the importing side of Note
// [ipc] (ipc_server.hpp).
//
// Needs only the driver: no tag, no arena. The import finds the exporter's GPU among this
// process's devices by UUID, retains its primary context (the one the CUDA runtime uses), asks
// the exporter over the job's socket, checks that the socket is held by the process the handle
// names (SO_PEERCRED and start time, so a reused pid is never trusted), imports the descriptors,
// maps them side by side in a range reserved here and grants read and write access. Every
// failure undoes what was done; the descriptors are closed whatever happens. The connection
// stays open while the range is mapped: the exporter counts the import live until it ends.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "handoff/ipc_messages.hpp"
#include "peers/unix_channel.hpp"

namespace tagmem::handoff {

class ipc_import {
 public:
  // Maps the export `h`. `job` and `dir`: this process's job and private directory. Throws PEER
  // (refused, exporter gone; the message says why), TAG_OFFLOADED, UNKNOWN_POINTER or DRIVER as
  // the exporter answered, INVALID_ARGUMENT (the GPU is not visible here), DRIVER, TIMEOUT.
  ipc_import(const ipc_handle& h, const std::string& job, const std::string& dir, int timeout_ms);
  ~ipc_import();  // unmaps, releases, frees the range, tells the exporter
  ipc_import(const ipc_import&) = delete;
  ipc_import& operator=(const ipc_import&) = delete;

  CUdeviceptr ptr() const noexcept { return base_ + offset_; }
  std::size_t bytes() const noexcept { return bytes_; }
  int ordinal() const noexcept { return ordinal_; }

 private:
  void unmap() noexcept;

  int ordinal_ = -1;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUdeviceptr base_ = 0;
  std::size_t span_ = 0, offset_ = 0, bytes_ = 0, mapped_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  std::unique_ptr<peers::unix_channel> ch_;
  int timeout_ms_ = 0;
};

}  // namespace tagmem::handoff
