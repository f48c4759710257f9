// service.hpp — handoff of device memory between the processes of one job on one GPU.
//
// Note [handoff]: colocated processes (an RL trainer and its rollout engine on one GPU) take
// turns: one offloads while the other reloads. Without handoff the memory the one gives up goes
// back to the driver (which scrubs it, and whose post-release work slows the copies beside it:
// Note [release aftermath]) and the other creates it anew. With TAGMEM_HANDOFF=on, the handles an
// offload unmaps (DISCARD at once, BACKUP as each mapping's copies complete: Note [unmap as
// copied]) go instead, as POSIX-fd shareable handles over a Unix socket, to a process of the same
// user, job and GPU that takes memory now, which maps them under its own addresses when it
// reloads: no create, no release, no scrub. Memory nobody takes goes to the driver as without it.
//  - Who takes: a process announces itself (listens, handoff_point.hpp) while it reloads, after
//    tagmem_handoff_expect, and with TAGMEM_HANDOFF_ANNOUNCE=after_offload (the default) while it
//    has offloaded tags, so that a framework calling pause and resume one after the other finds
//    the other side listening. It takes what it wants (want_book.hpp), in handles no larger than
//    its runs.
//  - Who gives: an offload with no tag coming in opens sessions with the takers when it starts
//    (outbox.hpp) and offers each handle it unmaps (vm_arena::unmap through physical_sink).
//  - Trust: the same uid (a 0700 directory, and SO_PEERCRED), the same job (TAGMEM_JOB) and GPU
//    (UUID), the process identified by pid and start time; checked before any descriptor moves
//    (trust.hpp). Handed memory carries the giver's bytes until overwritten: a BACKUP reload
//    overwrites every byte of its runs, a DISCARD reload may see another process's bytes of the
//    same job, which is why memory never crosses users or jobs.
//  - Releases: what nobody takes waits in the release queue while a process of the job copies a
//    reload on this GPU, at most TAGMEM_HANDOFF_TIMEOUT_MS a batch (copy_gate.hpp).
//  - Bounds: every step waits at most TAGMEM_HANDOFF_TIMEOUT_MS; memory received and not mapped
//    goes to the driver after TAGMEM_HANDOFF_HOLD_MS, when nothing is taken any more, and when
//    anything but a reload runs out of device memory (allocations never map received handles).
//  - Failure: a giver keeps each handle until TAKEN, so at no moment does nobody own the memory;
//    a process killed at any step leaves its handles to the kernel and driver, and its socket
//    to the next giver to remove. No tag's bytes ever depend on the other process.
// One service per device, created by the registry; its thread accepts givers and serves them one
// at a time, and gives back held memory whose hold ran out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "device/physical_flow.hpp"
#include "handoff/copy_gate.hpp"
#include "handoff/counters.hpp"
#include "handoff/identity.hpp"
#include "handoff/inbox.hpp"
#include "handoff/outbox.hpp"
#include "handoff/want_book.hpp"
#include "options/config.hpp"
#include "peers/rendezvous_point.hpp"

namespace tagmem {
class device;
}

namespace tagmem::handoff {

class service final : public peer_memory {
 public:
  // `job` and `dir`: the job's identity and private directory. Throws DRIVER, PEER.
  service(device& dev, const config& cfg, const std::string& job, const std::string& dir);
  ~service();  // stops taking; held memory goes to the release queue
  service(const service&) = delete;
  service& operator=(const service&) = delete;

  // tagmem_handoff_expect / cancel. expect throws PEER when it cannot listen.
  void expect(std::size_t bytes);
  void cancel() noexcept;
  // The bytes of this device's offloaded tags and their largest span of mappings side by side,
  // after each offload, reload and swap.
  void offloaded(std::size_t bytes, std::size_t largest_span) noexcept;
  // Whether a taker's socket of this process exists now.
  bool listening() const noexcept;
  // The bytes a giver being served is still expected to hand over (0 when none is served).
  std::uint64_t coming() const noexcept { return coming_.load(); }
  const counters& stats() const noexcept { return stats_; }
  std::size_t held_bytes() const noexcept { return inbox_.bytes(); }

  // Tests of the data path: a connected channel, no greeting, as giver or taker.
  void attach_for_test(int fd, bool giver);

 private:
  physical_sink* do_sink_for_offload(std::size_t out_bytes,
                                     std::size_t max_parts) noexcept override;
  void do_offload_done() noexcept override;
  physical_source& do_held() noexcept override { return inbox_; }
  void do_reloading(std::size_t wanted, std::size_t largest_run) noexcept override;
  void do_reload_done() noexcept override;
  void do_release_unfit(std::size_t largest_run) noexcept override;
  std::uint64_t do_still_coming() const noexcept override { return coming_.load(); }
  bool do_wait_for_more(std::chrono::steady_clock::time_point until,
                        std::uint64_t arrivals_seen) noexcept override;
  void do_waited(std::chrono::nanoseconds how_long, bool timed_out) noexcept override;
  void do_copying(bool on) noexcept override;
  bool do_others_copying() noexcept override { return gate_.others_copying(); }

  // Listens when the book says so (created here, so that a giver finds it as soon as this
  // returns); held memory goes when nothing is taken any more.
  void follow(bool announcing) noexcept;
  void run() noexcept;
  void wake() noexcept;

  device& dev_;
  identity id_;
  counters stats_;
  copy_gate gate_;  // the device's release thread asks it
  want_book book_;
  inbox inbox_;
  outbox outbox_;
  std::mutex offload_mutex_;  // sink_for_offload .. offload_done
  int offloads_ = 0;
  mutable std::mutex mutex_;                              // the fields below
  std::unique_ptr<peers::rendezvous_listener> listener_;  // destroyed only by the thread
  bool listen_ = false;
  std::unique_ptr<peers::unix_channel> attached_;  // attach_for_test's taker side
  bool stop_ = false;
  std::atomic<std::uint64_t> coming_{0};
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace tagmem::handoff
