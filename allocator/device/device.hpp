// device.hpp — what tagmem keeps per CUDA device: its primary context, allocation properties,
// dedicated copy streams, a pool of events, the queue of memory being released and the memory
// kept for recycling.
//
// tagmem works in each device's primary context (the one the CUDA runtime and PyTorch use), so
// its streams and copies interoperate with the application's. context_guard makes that context
// current for the calling thread and restores whatever was current before.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <mutex>

#include "device/kernel_copy.hpp"
#include "device/physical_flow.hpp"
#include "device/physical_recycler.hpp"
#include "device/release_queue.hpp"
#include "device/way_words.hpp"
#include "driver/context_guard.hpp"
#include "host/metadata_heap.hpp"
#include "options/config.hpp"

namespace tagmem {

class device {
 public:
  device(int ordinal, const config& cfg);  // retains the primary context; throws DRIVER
  ~device();
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  int ordinal() const noexcept { return ordinal_; }
  CUcontext context() const noexcept { return context_; }
  std::size_t granularity() const noexcept { return granularity_; }
  std::size_t total_bytes() const noexcept { return total_bytes_; }
  const CUmemAllocationProp& allocation_prop() const noexcept { return prop_; }
  const CUmemAccessDesc& access_desc() const noexcept { return access_; }
  // The GPU's UUID (a MIG instance has its own): what processes compare to know they share a GPU,
  // since ordinals depend on each process's CUDA_VISIBLE_DEVICES.
  const CUuuid& uuid() const noexcept { return uuid_; }
  // With TAGMEM_HANDOFF=on or TAGMEM_IPC=on and a device that exports POSIX-fd handles: every
  // cuMemCreate makes exportable handles (Note [handoff] in handoff/service.hpp, Note [ipc] in
  // handoff/ipc_server.hpp).
  bool exports_handles() const noexcept { return exports_handles_; }

  // Copy streams, `copy_streams` per direction (non-blocking, so the legacy default stream does
  // not serialise them with the application's work).
  CUstream d2h_stream(std::size_t i) const noexcept { return d2h_[i % d2h_.size()]; }
  CUstream h2d_stream(std::size_t i) const noexcept { return h2d_[i % h2d_.size()]; }
  std::size_t copy_stream_count() const noexcept { return h2d_.size(); }
  // Whether the setting and the release clock want the copy kernel now (a reload that has it
  // gives it no more pieces once this turns false).
  bool copy_kernel_wanted() const noexcept;
  // The copy kernel (Note [copy kernel]) when it is loaded (TAGMEM_COPY_KERNEL not `off`), wanted
  // now or not: a reload's queue asks copy_kernel_wanted() each time it hands pieces out
  // (copy_queue.hpp).
  kernel_copy* copy_kernel() noexcept { return kernel_.stream() != nullptr ? &kernel_ : nullptr; }
  // Waits for all of them (and the copy kernel's stream), also after one fails; returns the
  // first failure / throws it.
  CUresult wait_copy_streams() noexcept;
  void synchronize_copy_streams();

  // Events without timing, recycled; acquire throws DRIVER.
  CUevent acquire_event();
  void release_event(CUevent e) noexcept;

  // Makes `waiter` wait for all work queued on `producer` so far. No-op when they are equal.
  void order_after(CUstream waiter, CUstream producer);
  // Blocks the calling thread until all work queued on `producer` so far has finished.
  void wait_on_host(CUstream producer);

  // free and total device memory, as the driver reports them now.
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes);

  // Physical memory unmapped by DISCARD offloads and swaps, being released (Note [background
  // release]).
  release_queue& releases() noexcept { return releases_; }
  // Unmapped physical memory kept to be mapped again (Note [physical recycling]).
  physical_recycler& recycler() noexcept { return recycler_; }
  // The processes of the job that memory may go to and come from (Note [handoff] in
  // handoff/service.hpp); null without handoff. Set once, before any tag of the device exists.
  peer_memory* peers() noexcept { return peers_; }
  void set_peers(peer_memory* p) noexcept { peers_ = p; }
  // Words the copy streams wait on while an offload gives way (Note [copies give way]).
  way_words& ways() noexcept { return ways_; }

 private:
  template <class Use>
  void with_recorded(CUstream producer, Use use);

  int ordinal_;
  CUdevice dev_ = 0;
  CUcontext context_ = nullptr;
  std::size_t granularity_ = 0;
  std::size_t total_bytes_ = 0;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  CUuuid uuid_{};
  bool exports_handles_ = false;
  peer_memory* peers_ = nullptr;
  meta_vector<CUstream> d2h_, h2d_;
  copy_kernel_use kernel_use_;
  kernel_copy kernel_;
  std::mutex events_mutex_;
  meta_vector<CUevent> free_events_;
  release_queue releases_;
  physical_recycler recycler_;
  way_words ways_;
};

}  // namespace tagmem
