// copy_queue.hpp — host↔device copies queued on a device's copy streams, in pieces.
//
// Every byte tagmem moves between a device and the pinned host store goes through here: tags'
// offloads, reloads and swaps (offload_engine.cpp) and the pause and resume of NCCL's memory
// (integrations/nccl). A range is cut into pieces of at most copy_piece_bytes, also where a host
// extent ends; device-to-host pieces go round-robin over the device's D2H streams, so that
// several are in flight at once, and each is followed by an event, so that the caller learns
// when the bytes under a piece are safe to unmap without waiting for the rest.
//
// Host-to-device pieces go round-robin over the H2D streams too in a queue made with
// h2d_lanes::round_robin. In one made with h2d_lanes::by_room (a reload's) they wait in the
// queue, and each lane — every H2D stream, and the copy kernel's stream (Note [copy kernel] in
// kernel_copy.hpp) while the device wants the kernel (after a release) — takes the next one
// whenever it has fewer than its depth in flight, so a lane slowed down copies less.
// Note [a stalled stream]: with another process of the GPU copying at the same time, a copy
// stream of a reload can make no progress for hundreds of milliseconds while its other stream
// copies on (docs/handoff.md, "A stalled copy stream"); a stalled lane then holds at most its
// depth, which runs once the others are done, not half the reload. The kernel does not take over
// from a stalled lane: its reads of pinned host memory slowed both processes' copy engines more
// than the stall cost. The queue hands pieces out when more are queued, at pump() and in
// finish(): a caller that waits for anything else while pieces wait pumps, and one that waits
// for the copy streams by itself must use h2d_lanes::round_robin.
//
// A queue belongs to one caller on one thread, with the device's context current; it holds no
// lock (the streams are the device's, shared with other queues: finish() waits for theirs too).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
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

// How host-to-device pieces reach the copy streams: dealt at once, or taken by lanes with room.
enum class h2d_lanes { round_robin, by_room };

class copy_queue {
 public:
  explicit copy_queue(device& dev, h2d_lanes lanes = h2d_lanes::round_robin) noexcept
      : dev_(dev), lanes_wanted_(lanes) {}
  ~copy_queue();  // the events go back to the device's pool
  copy_queue(const copy_queue&) = delete;
  copy_queue& operator=(const copy_queue&) = delete;

  // From now on, device-to-host pieces go to one D2H stream, so they finish in the order they
  // were queued. Copy engines need not serve the streams of one direction fairly: on an H200 one
  // stream's whole queue of pieces ran before the other stream's first piece finished, so with
  // pieces round-robin over two streams no range was copied whole until half of all was.
  void keep_d2h_order() noexcept { d2h_one_stream_ = true; }
  // From now on, each device-to-host piece first waits, on its stream, until the word of pinned
  // host memory at device address `word` reads 0 (Note [copies give way] in offload/give_way.hpp);
  // whoever lent the word must open it before anything waits for these pieces for good.
  void d2h_wait_on(CUdeviceptr word) noexcept { d2h_word_ = word; }
  // Queues `p` device -> host on the next D2H stream and records an event after it; returns
  // that event (the queue's: valid until the queue is destroyed). `tag` names the copy in a
  // trace (docs/observe.md). Throws DRIVER.
  CUevent to_host(const backup_piece& p, const char* tag);
  // Queues `p` host -> device on the next H2D stream, or for the next lane with room. `tag`
  // must outlive the queue. Throws DRIVER (also for a piece queued earlier and handed out now).
  void to_device(const backup_piece& p, const char* tag);

  // Whether pieces wait for a lane.
  bool pieces_waiting() const noexcept { return next_waiting_ < waiting_.size(); }
  // Gives waiting pieces to the lanes with room; a failure is kept for finish().
  void pump() noexcept;

  // Hands out every waiting piece, then waits for every copy stream of the device, also after
  // one fails (device.hpp); throws the first failure. When it returns or throws, no copy queued
  // here is running, and none is left waiting.
  void finish();

  // Pieces in flight per lane while pieces wait: enough to keep the copy engines busy while the
  // caller maps (and creates) the next run of a reload (16 × 64 MiB is about 20 ms of the link),
  // few enough that a stalled lane holds a small part of a large reload. While the kernel is
  // wanted every lane holds at most kernel_lane_depth, the kernel's (first) as the engines'.
  static constexpr std::size_t engine_lane_depth = 16;
  static constexpr std::size_t kernel_lane_depth = 4;

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
  // How many pieces `l` holds at most; while the kernel is wanted the engines' lanes are as short
  // as its own: they are the slow ones then, and what they hold finishes last.
  static std::size_t depth(const lane& l, bool kernel_wanted) noexcept {
    return l.kernel != nullptr || kernel_wanted ? kernel_lane_depth : engine_lane_depth;
  }
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
  CUdeviceptr d2h_word_ = 0;  // 0: pieces do not wait
};

}  // namespace tagmem
