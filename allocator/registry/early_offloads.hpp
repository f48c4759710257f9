// early_offloads.hpp — offloads that return once their copies are queued
// (TAGMEM_OFFLOAD_RETURN=queued).
//
// Note [early return]: a framework that switches phases with RPCs calls the outgoing side's pause
// and then the incoming side's resume, one after the other, so the outgoing device-to-host copies
// and the incoming host-to-device copies never share the link, and with handoff the incoming side
// only starts once everything was given. With TAGMEM_OFFLOAD_RETURN=queued an offload runs on a
// thread of its own: the call returns once every copy is queued (the tags' locks taken, the device
// synchronised: Note [offload waits]) and the thread then unmaps, and gives to the job's processes
// (Note [handoff]), each mapping as its copies complete, exactly as the calling thread would have.
// What the process sees meanwhile:
//  - the tags stay locked until their offload ends: any call that touches one of them (reload,
//    allocate or free in it, its statistics, another offload) waits for the end; tags it does
//    not name, and other tagmem calls, do not wait, except that with handoff an offload, reload
//    or swap of other tags of the device waits for it before returning (it counts the device's
//    offloaded bytes, Note [handoff]);
//  - a failure before the copies are queued is the call's own, with every tag as it was; one
//    after (a failed copy, which leaves the tags resident with their bytes, as Note [unmap as
//    copied] says) is logged and returned by the next tagmem_wait_released on that device;
//  - tagmem_wait_released waits for the device's early offloads first, tagmem_shutdown for all,
//    and a process that exits waits for them in an atexit handler, so no thread is cut off in a
//    driver call. A process killed meanwhile loses what it would lose without early return: its
//    memory goes back with it, and no handle it gave depends on it any more.
//
// Note [drop before copying]: an offload first waits for all work queued on the device (Note
// [offload waits]), and that includes the copies of an offload that returned early; with handoff
// it also waits for that offload's end before returning. So a caller that offloads some tags with a
// backup and others without, in two calls, makes the DISCARD call first: its memory then goes (to
// the driver or to a process of the job) at once, instead of after every byte of the others was
// copied. tagmem's own callers do (the torch_memory_saver drop-in's pause, vLLM's sleep).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

namespace tagmem {

class early_offloads {
 public:
  early_offloads();
  ~early_offloads();  // waits for every offload
  early_offloads(const early_offloads&) = delete;
  early_offloads& operator=(const early_offloads&) = delete;

  // The offload of device `ordinal`, on a thread of its own: `body` runs the whole offload and
  // calls its argument once the copies are queued. Returns then; throws what `body` threw before
  // that (nothing is changed then). Throws DRIVER when no thread can be started.
  using body_type = std::function<void(const std::function<void()>& queued)>;
  void start(int ordinal, body_type body);
  // Waits for the early offloads of `ordinal` (-1: every device); rethrows the first failure one
  // of them met after returning, and forgets it.
  void wait(int ordinal);
  // Waits for every early offload of every live instance (the atexit handler).
  static void wait_all_live() noexcept;

 private:
  struct job {
    int ordinal = 0;
    bool queued = false, finished = false, joining = false;
    std::exception_ptr error;  // before queued: the caller's; after: deferred
    std::thread thread;
  };
  void join_where(int ordinal, std::unique_lock<std::mutex>& lock);
  void forget(std::list<job>::iterator it);  // under mutex_

  std::mutex mutex_;
  std::condition_variable changed_;
  std::list<job> jobs_;
  std::exception_ptr deferred_;
  int deferred_ordinal_ = -1;
};

}  // namespace tagmem
