// release_queue.hpp — cuMemRelease of unmapped physical memory on a background thread.
//
// Note [background release]: the driver scrubs device memory when it gets it back, so cuMemRelease
// costs time linear in bytes, whatever the chunk size and however many threads call it
// (docs/performance.md, "Mapping costs"). A DISCARD offload copies nothing, so that release would
// be its whole cost. Instead the offload unmaps (which is what makes the addresses fault and the
// tag offloaded) and hands the handles to this queue, whose thread releases them while the caller
// goes on. The bytes are back with the driver shortly after; until then:
//  - tagmem itself never fails for want of them: map_physical() drains the queue and retries
//    when cuMemCreate runs out of memory, and empty_cache and shutdown drain it;
//  - other code (another process, cudaMalloc) can be made to wait with tagmem_wait_released();
//    the torch_memory_saver and vLLM compat layers do so, and tagmem_device_stats reports the
//    bytes still pending.
// While an offload is still unmapping (hold()), the handles it queues wait: a release running in
// the driver slows the unmaps next to it, so they go first and the releases after. A hold holds
// back only what is queued after it: the handles already queued go on (see Note [releases wait
// for copies] for why a few at a time, and for why they must not wait).
// A swap's out-side goes the same way: a release running while both directions copy slows the
// copies (docs/performance.md, "Swap").
// A handle whose release fails stays in the queue and is tried again by the next drain (and at
// the latest by the destructor), so a transient failure leaks nothing (as Note [release later]).
// TAGMEM_DISCARD_RELEASE=wait and TAGMEM_SWAP_RELEASE=inline release on the calling thread
// instead.
// Note [releases wait for copies]: with handoff, another process of the job on this GPU may be
// copying a reload into memory this one handed over while this one's leftovers wait here, and a
// release's aftermath would halve those copies (Note [release aftermath]), for a time that grows
// with the bytes released. So the thread asks its gate before each few handles and waits, polling,
// while the gate says copies are running, at most the gate's bound: a reload that marks while
// leftovers go back (one short of memory takes its mark again once it has what it lacks) holds
// back all but the handles in hand, and one that waits for memory gets it a few at a time, not
// all of it at once. The handles in hand are one, or as many as make bytes_per_ask: an ask scans
// the job's marks (a directory listing and a lock probe each), and a few MiB released beside
// copies slow them little. Once a wait runs out the bound, the rest go in one batch. The next
// offload's hold does not stop them, as it would not stop one batch: a pause's leftovers, queued
// as its first tag goes, would otherwise wait while its next one unmaps and go only at its end,
// just before the other side's reload, whose copies their release would slow (Note [release
// aftermath]; docs/handoff.md, Limits).
// tagmem_wait_released waits as the thread does before it drains (wait_for_copies); drain() alone
// does not ask: who drains on running out of memory needs the memory now.
#pragma once

#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

#include "host/metadata_heap.hpp"

namespace tagmem {

// What the release thread asks before each few handles (Note [releases wait for copies]).
class release_gate {
 public:
  // Whether a release now would slow copies that are running (polled every few ms).
  bool copies_running() noexcept { return do_copies_running(); }

 protected:
  ~release_gate() = default;

 private:
  virtual bool do_copies_running() noexcept = 0;
};

class release_queue {
 public:
  // With a gate, the thread releases handles adding up to this many bytes after each ask (one
  // handle at least, handles_per_ask at most).
  static constexpr std::size_t bytes_per_ask = std::size_t{64} << 20;
  static constexpr std::size_t handles_per_ask = 32;  // 64 MiB of the smallest granularity

  release_queue() = default;
  ~release_queue();  // drains (once more trying failed releases) and stops the thread
  release_queue(const release_queue&) = delete;
  release_queue& operator=(const release_queue&) = delete;

  // Queues `handle` (already unmapped everywhere) for release. Throws (OUT_OF_MEMORY for its
  // record, DRIVER if the thread cannot start) with nothing queued: the caller then releases it
  // itself.
  void push(CUmemGenericAllocationHandle handle, std::size_t bytes);
  // Releases what is queued on this thread, waits for what the thread is releasing, then tries
  // the failed ones again (each handle at most twice here). Returns the first error
  // (CUDA_SUCCESS when nothing is pending); handles that failed stay queued.
  CUresult drain() noexcept;
  // While held (calls nest), what is pushed waits until the last hold ends; what was queued before
  // goes on. drain() releases both.
  void hold() noexcept;
  void unhold() noexcept;
  // Bytes queued or failed, not yet back with the driver.
  std::size_t pending_bytes() const noexcept;
  // The thread asks `gate` (null: none) before each few handles and waits at most `bound` for it;
  // the gate is asked under this queue's lock, so that once this returns the old one is not in use.
  void set_gate(release_gate* gate, std::chrono::milliseconds bound) noexcept;
  // What the gate says now (false without one): a release here would slow running copies.
  bool copies_running() noexcept;
  // Waits while the gate says copies are running, at most its bound.
  void wait_for_copies() noexcept;

 private:
  struct item {
    CUmemGenericAllocationHandle handle;
    std::size_t bytes;
  };
  void work() noexcept;
  // Waits while the gate says copies run, at most its bound (`lock` holds mutex_); the thread
  // (`thread`) also stops waiting when asked to stop or when a drain took its batch. Returns
  // whether the bound ran out with copies still running.
  bool wait_while_copies_run(std::unique_lock<std::mutex>& lock, bool thread) noexcept;
  // Releases [first, last), adding the bytes released to `released`; the ones that failed are
  // moved to the front, and the end of them is returned.
  static item* release_all(item* first, item* last, std::size_t& released) noexcept;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  meta_vector<item> queued_;  // waiting for the thread
  meta_vector<item> later_;   // pushed while held: join queued_ when the last hold ends
  meta_vector<item> failed_;  // cuMemRelease failed (or drain() took them); released by drain()
  std::size_t pending_bytes_ = 0;
  std::size_t in_flight_ = 0;  // records the thread took out of queued_ and is releasing
  int holds_ = 0;
  bool stop_ = false;
  release_gate* gate_ = nullptr;
  std::chrono::milliseconds gate_bound_{0};
  std::thread thread_;
};

}  // namespace tagmem
