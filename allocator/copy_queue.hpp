// copy_queue.hpp — host↔device copies queued on a device's copy streams, in pieces.
//
// Every byte tagmem moves between a device and the pinned host store goes through here: tags'
// offloads, reloads and swaps (offload_engine.cpp) and the pause and resume of NCCL's memory
// (integrations/nccl). A range is cut into pieces of at most copy_piece_bytes, also where a host
// extent ends; pieces go round-robin over the device's copy streams of their direction, so that
// several are in flight at once, and each device-to-host piece is followed by an event, so that
// the caller learns when the bytes under a piece are safe to unmap without waiting for the rest.
//
// A queue belongs to one caller on one thread, with the device's context current; it holds no
// lock (the streams are the device's, shared with other queues: finish() waits for theirs too).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "device.hpp"
#include "host_store.hpp"
#include "metadata_heap.hpp"

namespace tagmem {

// One copy: `bytes` at device address `dev` and host address `host`.
struct backup_piece {
  CUdeviceptr dev = 0;
  char* host = nullptr;
  std::size_t bytes = 0;
};

// Where cutting has got to in a list of host extents.
struct extent_cursor {
  const meta_vector<host_extent>& extents;
  std::size_t index = 0;   // extents[index] is being filled
  std::size_t offset = 0;  // bytes of it already used
};

// Appends to `out` the pieces that copy device range [at, end) to or from the host extents at
// `cursor`, which it advances. The extents must hold at least end - at bytes from the cursor on.
void cut_pieces(CUdeviceptr at, CUdeviceptr end, extent_cursor& cursor, std::size_t piece_bytes,
                meta_vector<backup_piece>& out);

class copy_queue {
 public:
  explicit copy_queue(device& dev) noexcept : dev_(dev) {}
  ~copy_queue();  // the events go back to the device's pool
  copy_queue(const copy_queue&) = delete;
  copy_queue& operator=(const copy_queue&) = delete;

  // Queues `p` device -> host on the next D2H stream and records an event after it; returns
  // that event (the queue's: valid until the queue is destroyed). `tag` names the copy in a
  // trace (docs/observe.md). Throws DRIVER.
  CUevent to_host(const backup_piece& p, const char* tag);
  // Queues `p` host -> device on the next H2D stream. Throws DRIVER.
  void to_device(const backup_piece& p, const char* tag);

  // Waits for every copy stream of the device, also after one fails (device.hpp); throws the
  // first failure. When it returns or throws, no copy queued here is running.
  void finish() { dev_.synchronize_copy_streams(); }

 private:
  device& dev_;
  meta_vector<CUevent> events_;
  std::size_t next_d2h_ = 0, next_h2d_ = 0;
};

}  // namespace tagmem
