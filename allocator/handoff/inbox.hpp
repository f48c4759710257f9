// inbox.hpp — handles received from the job's other processes and not mapped yet.
//
// The taker thread puts what it imports here; a reload takes them (map_parts, largest first,
// as the recycler's kept handles) instead of creating memory. What is not mapped goes to the
// device's release queue: after TAGMEM_HANDOFF_HOLD_MS, when a reload finds it too large for any
// run left, when the process stops taking memory, or when anything of the process runs out of
// device memory outside a reload. The mutex is a leaf.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "device/physical_flow.hpp"
#include "handoff/counters.hpp"

namespace tagmem {
class device;
}

namespace tagmem::handoff {

class inbox final : public physical_source {
 public:
  using clock = std::chrono::steady_clock;
  inbox(device& dev, counters& stats) : dev_(dev), stats_(stats) {}
  ~inbox();  // whatever is held goes to the release queue
  inbox(const inbox&) = delete;
  inbox& operator=(const inbox&) = delete;

  // Keeps a received handle and `fd`, the descriptor it came with (-1: none; owned from now on,
  // closed whatever the outcome when not kept). The descriptor is recorded (received_fds) before
  // the handle can be taken: a reload or the mapping-ahead thread may take it, map it and release
  // it at once, and that release must close the descriptor, not find it unrecorded and leave it
  // open for ever. False (keeping nothing, the handle still the caller's) when no record can be
  // made.
  bool put(physical_part p, int fd) noexcept;
  // Tests only: `fn(handle, arg)` runs on the thread of put() as soon as the handle can be taken.
  struct arrival_observer {
    void (*fn)(CUmemGenericAllocationHandle, void*);
    void* arg;
  };
  void observe_arrivals(const arrival_observer* o) noexcept { observer_.store(o); }
  // To the release queue: handles held since before `cutoff` / larger than `largest` (0: all).
  void release_older_than(clock::time_point cutoff) noexcept;
  void release_larger_than(std::size_t largest) noexcept;
  // When the oldest held handle arrived (time_point::max() when none is held).
  clock::time_point oldest() const noexcept;
  // Waits until a handle has arrived since `seen` (an arrivals() figure) or `until`; returns
  // whether one has.
  bool wait_for_arrival(clock::time_point until, std::uint64_t seen) noexcept;

 private:
  struct item {
    CUmemGenericAllocationHandle handle;
    clock::time_point arrived;
  };
  using held_map = std::multimap<std::size_t, item>;  // by size
  void do_take_up_to(std::size_t bytes, meta_vector<physical_part>& out) override;
  std::size_t do_would_take(std::size_t bytes) const noexcept override;
  bool do_put_back(const physical_part& p) noexcept override;
  void do_mapped(std::size_t bytes) noexcept override;
  std::uint64_t do_arrivals() const noexcept override;
  bool do_release_one(std::size_t bytes, std::uint64_t arrivals_seen) noexcept override;
  std::size_t do_bytes() const noexcept override;
  std::size_t do_largest() const noexcept override;
  template <class Pred>
  void release_if(Pred pred) noexcept;
  void release_all(held_map& out) noexcept;  // to the release queue

  device& dev_;
  counters& stats_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  held_map held_;
  std::size_t bytes_ = 0;
  std::uint64_t arrivals_ = 0;
  std::atomic<const arrival_observer*> observer_{nullptr};
};

}  // namespace tagmem::handoff
