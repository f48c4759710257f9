// physical_flow.hpp — where physical memory may go instead of the driver, and come from instead
// of cuMemCreate: the seams through which the offload pipeline and the arenas reach the other
// processes of the job (Note [handoff] in handoff/service.hpp) without knowing about them.
//
// Public calls forward to private virtual ones (the implementation lives in handoff/, above this
// layer). A device without handoff has no peer_memory and none of this is ever called.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>

#include "device/physical_recycler.hpp"
#include "host/metadata_heap.hpp"

namespace tagmem {

// Where an unmapped handle may go instead of the driver.
class physical_sink {
 public:
  // Whether a handle of `bytes` would be taken now (a parked mapping is unmapped for it).
  bool wants(std::size_t bytes) const noexcept { return do_wants(bytes); }
  // Offers one unmapped handle. true: the sink owns it now; false: the caller still does and
  // disposes of it as it would have.
  bool offer(physical_part p) noexcept { return do_offer(p); }

 protected:
  ~physical_sink() = default;

 private:
  virtual bool do_wants(std::size_t bytes) const noexcept = 0;
  virtual bool do_offer(physical_part p) noexcept = 0;
};

// Handles to map before creating new ones, as the recycler's.
class physical_source {
 public:
  // Takes, largest first, handles whose sizes add up to at most `bytes`; appends them to `out`
  // (throws OUT_OF_MEMORY for room in `out` with nothing taken).
  void take_up_to(std::size_t bytes, meta_vector<physical_part>& out) { do_take_up_to(bytes, out); }
  // The bytes that take_up_to(bytes) would take now; takes nothing.
  std::size_t would_take(std::size_t bytes) const noexcept { return do_would_take(bytes); }
  // Takes back a handle taken from here and not mapped; false: the caller still owns it.
  bool put_back(const physical_part& p) noexcept { return do_put_back(p); }
  // Notes that `bytes` taken from here are mapped now (statistics).
  void mapped(std::size_t bytes) noexcept { do_mapped(bytes); }
  // How many handles have arrived so far (put back ones do not count).
  std::uint64_t arrivals() const noexcept { return do_arrivals(); }
  // Sends one handle to the driver, the smallest, for room to create `bytes` that the handles
  // taken do not cover. False, sending none, when none is held, or when one may serve the
  // caller's next try instead: one arrived since `arrivals_seen` (the caller's arrivals() before
  // it looked at what is held), or one fits in `bytes`.
  bool release_one(std::size_t bytes, std::uint64_t arrivals_seen) noexcept {
    return do_release_one(bytes, arrivals_seen);
  }
  std::size_t bytes() const noexcept { return do_bytes(); }
  // The size of the largest handle held (0 when none).
  std::size_t largest() const noexcept { return do_largest(); }

 protected:
  ~physical_source() = default;

 private:
  virtual void do_take_up_to(std::size_t bytes, meta_vector<physical_part>& out) = 0;
  virtual std::size_t do_would_take(std::size_t bytes) const noexcept = 0;
  virtual bool do_put_back(const physical_part& p) noexcept = 0;
  virtual void do_mapped(std::size_t bytes) noexcept = 0;
  virtual std::uint64_t do_arrivals() const noexcept = 0;
  virtual bool do_release_one(std::size_t bytes, std::uint64_t arrivals_seen) noexcept = 0;
  virtual std::size_t do_bytes() const noexcept = 0;
  virtual std::size_t do_largest() const noexcept = 0;
};

// All that the offload pipeline sees of the job's other processes; one per device.
class peer_memory {
 public:
  // An offload of `out_bytes` in at most `max_parts` handles starts: a sink when some process
  // of the job takes memory now, else null (the memory goes to the driver as without handoff).
  // Every non-null sink is followed by offload_done().
  physical_sink* sink_for_offload(std::size_t out_bytes, std::size_t max_parts) noexcept {
    return do_sink_for_offload(out_bytes, max_parts);
  }
  void offload_done() noexcept { do_offload_done(); }
  // Received handles not mapped yet.
  physical_source& held() noexcept { return do_held(); }
  // A reload of `wanted` bytes starts, whose adjacent runs add up to at most `largest_run` (a
  // handle that large can still be mapped: Note [runs grow to the handles held] in
  // offload_engine.cpp): the job's processes may hand memory to this one until reload_done.
  void reloading(std::size_t wanted, std::size_t largest_run) noexcept {
    do_reloading(wanted, largest_run);
  }
  void reload_done() noexcept { do_reload_done(); }
  // Held handles larger than `largest_run` go to the driver (0: every held handle).
  void release_unfit(std::size_t largest_run) noexcept { do_release_unfit(largest_run); }
  // The bytes a process of the job handing memory to this one now is still expected to hand
  // over (0 when none is).
  std::uint64_t still_coming() const noexcept { return do_still_coming(); }
  // Waits until `until` unless a handle has arrived since `arrivals_seen` (held().arrivals()
  // before the caller last looked); returns whether one did.
  bool wait_for_more(std::chrono::steady_clock::time_point until,
                     std::uint64_t arrivals_seen) noexcept {
    return do_wait_for_more(until, arrivals_seen);
  }
  // A reload waited `how_long` for memory (statistics); `timed_out`: and then gave up.
  void waited(std::chrono::nanoseconds how_long, bool timed_out) noexcept {
    do_waited(how_long, timed_out);
  }
  // A reload copies with all the memory it needs in hand (true: Note [copying in hand] in
  // offload/offload_engine.cpp), until its copies end or it waits for memory (false); the
  // job's processes hold their releases back meanwhile (Note [releases wait for copies] in
  // release_queue.hpp).
  void copying(bool on) noexcept { do_copying(on); }
  // Whether another process of the job has a reload copying with its memory in hand now (its
  // copying(true) .. copying(false)): an offload of this one may give it the link (Note [copies
  // give way] in offload/give_way.hpp). Polled, every fraction of a millisecond.
  bool others_copying() noexcept { return do_others_copying(); }

 protected:
  ~peer_memory() = default;

 private:
  virtual physical_sink* do_sink_for_offload(std::size_t out_bytes,
                                             std::size_t max_parts) noexcept = 0;
  virtual void do_offload_done() noexcept = 0;
  virtual physical_source& do_held() noexcept = 0;
  virtual void do_reloading(std::size_t wanted, std::size_t largest_run) noexcept = 0;
  virtual void do_reload_done() noexcept = 0;
  virtual void do_release_unfit(std::size_t largest_run) noexcept = 0;
  virtual std::uint64_t do_still_coming() const noexcept = 0;
  virtual bool do_wait_for_more(std::chrono::steady_clock::time_point until,
                                std::uint64_t arrivals_seen) noexcept = 0;
  virtual void do_waited(std::chrono::nanoseconds how_long, bool timed_out) noexcept = 0;
  virtual void do_copying(bool on) noexcept = 0;
  virtual bool do_others_copying() noexcept = 0;
};

}  // namespace tagmem
