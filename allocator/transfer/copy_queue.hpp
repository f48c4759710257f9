// copy_queue.hpp — host↔device copies queued on a device's copy streams, in pieces.
//
// Every byte tagmem moves between a device and the pinned host store goes through here: tags'
// offloads, reloads and swaps (offload_engine.cpp) and the pause and resume of NCCL's memory
// (integrations/nccl). A range is cut into pieces of at most copy_piece_bytes, also where a host
// extent ends; pieces go round-robin over the device's copy streams of their direction, so that
// several are in flight at once, and each device-to-host piece is followed by an event, so that
// the caller learns when the bytes under a piece are safe to unmap without waiting for the rest.
// A queue made with h2d_lanes::share_with_kernel lets the copy kernel take host-to-device pieces
// too, when the device offers it (Note [copy kernel] in kernel_copy.hpp): the pieces then wait
// in the queue, and each lane (every H2D stream, and the kernel's stream) takes the next one
// whenever it has fewer than lane_depth in flight, so a lane slowed down copies less; the kernel
// stops taking pieces once the device no longer wants it (the release is long enough ago). The
// queue hands pieces out when more are queued and in finish(); a caller that waits for the copy
// streams by itself must use h2d_lanes::copy_engines.
//
// A queue belongs to one caller on one thread, with the device's context current; it holds no
// lock (the streams are the device's, shared with other queues: finish() waits for theirs too).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <exception>

#include "device/device.hpp"
#include "host/host_store.hpp"
#include "host/metadata_heap.hpp"

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

// Who copies host to device: the copy engines only, or they and the copy kernel when it helps.
enum class h2d_lanes { copy_engines, share_with_kernel };

class copy_queue {
 public:
  explicit copy_queue(device& dev, h2d_lanes lanes = h2d_lanes::copy_engines) noexcept
      : dev_(dev), lanes_wanted_(lanes) {}
  ~copy_queue();  // the events go back to the device's pool
  copy_queue(const copy_queue&) = delete;
  copy_queue& operator=(const copy_queue&) = delete;

  // From now on, device-to-host pieces go to one D2H stream, so they finish in the order they
  // were queued. Copy engines need not serve the streams of one direction fairly: on an H200 one
  // stream's whole queue of pieces ran before the other stream's first piece finished, so with
  // pieces round-robin over two streams no range was copied whole until half of all was.
  void keep_d2h_order() noexcept { d2h_one_stream_ = true; }
  // Queues `p` device -> host on the next D2H stream and records an event after it; returns
  // that event (the queue's: valid until the queue is destroyed). `tag` names the copy in a
  // trace (docs/observe.md). Throws DRIVER.
  CUevent to_host(const backup_piece& p, const char* tag);
  // Queues `p` host -> device on the next H2D stream, or for the next lane with room. `tag`
  // must outlive the queue. Throws DRIVER (also for a piece queued earlier and handed out now).
  void to_device(const backup_piece& p, const char* tag);

  // Hands out every waiting piece, then waits for every copy stream of the device, also after
  // one fails (device.hpp); throws the first failure. When it returns or throws, no copy queued
  // here is running, and none is left waiting.
  void finish();

  // Pieces in flight per lane while pieces wait: enough to keep a lane busy while the caller
  // maps the next run of a reload.
  static constexpr std::size_t lane_depth = 4;

 private:
  struct waiting {
    backup_piece piece;
    const char* tag;
  };
  struct lane {
    CUstream stream = nullptr;
    kernel_copy* kernel = nullptr;   // null: a copy engine's stream
    meta_vector<CUevent> in_flight;  // oldest first
  };
  void choose_lanes();
  bool hand_out();
  void retire(lane& l);
  void give_back_events() noexcept;

  device& dev_;
  h2d_lanes lanes_wanted_;
  bool lanes_chosen_ = false;
  meta_vector<lane> lanes_;  // empty: pieces go straight to the H2D streams
  meta_vector<waiting> waiting_;
  std::size_t next_waiting_ = 0;
  std::exception_ptr failed_;  // the first failure to hand out a piece; finish() throws it
  meta_vector<CUevent> events_;
  std::size_t next_d2h_ = 0, next_h2d_ = 0;
  bool d2h_one_stream_ = false;
};

}  // namespace tagmem
