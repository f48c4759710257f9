// give_way.hpp — an offload that returned early holds its device-to-host copies back while another
// process of the job copies a reload (TAGMEM_HANDOFF_GIVE_WAY).
//
// Note [copies give way]: the copy engines share the link about evenly between two processes'
// copies (docs/handoff.md, "Giving way"), so in a phase switch the incoming reload's
// host-to-device copies run at half the link while the outgoing offload's device-to-host copies
// run beside them. With early return (Note [early return]) nobody waits for the outgoing copies:
// the pause has returned, and once the reload has all the memory it maps in hand it needs none of
// the memory they free. The reload is what the switch waits for. So, in an offload that returned
// early, each device-to-host piece first waits on its stream (cuStreamWaitValue32) until a word of
// pinned host memory (device/way_words.hpp) reads open, and the offload's own thread, which waits
// for those pieces anyway to unmap behind them, closes the word while another process of the job
// holds its copy mark (a reload copying with its memory in hand: Note [copying in hand] in
// offload_engine.cpp, handoff/copy_gate.hpp) and opens
// it otherwise, polling every poll_every. Then:
//  - the reload runs at the link's rate, alone, and the offload's copies after it: its memory goes
//    back (to the job or the driver) that much later, and whatever waits for the offload's end or
//    for the whole device (tagmem_wait_released, a reload of its tags, the process's exit,
//    cuCtxSynchronize) waits that much longer;
//  - pieces already running finish; the next one on each stream waits. A reload's mark shows at
//    the next poll;
//  - a copier killed drops its mark with its lock, and the word opens at the next poll; a word
//    kept closed for TAGMEM_HANDOFF_TIMEOUT_MS in all opens for the rest of the offload;
//  - this process's own reloads do not close it: within one process the two directions share
//    the link at its both-ways rate;
//  - calls made at the same time (no early return) never give way: there the pause's caller waits
//    for its copies, and the pause would return after the reload and its own copies instead of
//    with the reload;
//  - the word is open before the offload restores its tags after a failure, and before its
//    thread ends, so nothing waits on a closed word that nobody will open.
#pragma once

#include <chrono>
#include <cstdint>

#include "device/device.hpp"

namespace tagmem {

class give_way {
 public:
  static constexpr std::chrono::microseconds poll_every{200};

  explicit give_way(device& dev) noexcept : dev_(dev) {}
  ~give_way();  // opens the word and gives it back: the pieces that waited on it have finished
  give_way(const give_way&) = delete;
  give_way& operator=(const give_way&) = delete;

  // Borrows a word (open) when the device has peers; `bound`: how long it may be closed in all.
  // Does nothing when no word can be had. Call with the device's context current.
  void start(std::chrono::milliseconds bound) noexcept;
  // The word's device address, for copy_queue::d2h_wait_on; 0 when not started.
  CUdeviceptr word() const noexcept { return word_ ? way_words::address(word_) : 0; }
  // Whether the word may still close: started and not stopped.
  bool active() const noexcept { return word_ != nullptr && !stopped_; }
  // Closes or opens the word as the job's other processes copy now (at most once per
  // poll_every; callers loop).
  void keep() noexcept;
  // Opens the word for good: keep() does nothing afterwards.
  void stop() noexcept;

 private:
  void set(bool closed) noexcept;

  device& dev_;
  std::uint32_t* word_ = nullptr;
  bool closed_ = false;
  bool stopped_ = false;
  std::chrono::steady_clock::duration bound_{};
  std::chrono::steady_clock::duration closed_for_{};  // before closed_since_
  std::chrono::steady_clock::time_point closed_since_{}, polled_{};
};

}  // namespace tagmem
