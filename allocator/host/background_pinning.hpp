// background_pinning.hpp — pins host memory for BACKUP tags while they grow, so that their first
// offload finds the pinned host store ready.
//
// Note [pin ahead]: pinning costs far more than copying through the pinned memory (Note [pin
// once]), so a first offload that has to pin its store runs several times slower than the next
// ones. A tag whose owner said it will be offloaded with BACKUP (tagmem_tag_plan_offload; the
// torch_memory_saver compat layer says so for regions with a CPU backup) wakes this thread
// whenever it maps new memory; the thread has the store grow in the background (as
// tagmem_host_reserve does; an offload that needs the bytes waits for that growth instead of
// pinning them twice) to what the backups hold plus every such resident tag's mapped bytes,
// never past the host budget (Note [host budget]): beyond it, it pins up to it and the offload
// pins or fails for the rest as before. TAGMEM_PIN_AHEAD=off
// turns it off. The thread holds one tag's mutex at a time, briefly, and pins with no lock of
// tagmem's held; shutdown stops it after the pinning under way. In a forked child it does not
// exist, and nothing there can wake it (Note [fork]).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>

namespace tagmem {

class host_store;

class background_pinning {
 public:
  // The host store (created on first use by its owner), and the bytes that planned-BACKUP
  // resident tags have mapped now, counted by the tags' owner; both may throw.
  using store_access = std::function<host_store&()>;
  using planned_bytes = std::function<std::size_t()>;

  // Becomes the process's pinner; starts no thread.
  background_pinning(store_access store, planned_bytes planned);
  ~background_pinning();  // stops the thread after the pinning under way
  background_pinning(const background_pinning&) = delete;
  background_pinning& operator=(const background_pinning&) = delete;

  // A planned-BACKUP tag grew; never blocks, never throws (a thread that cannot start is
  // dropped: the offload then pins for itself).
  void wake() noexcept;
  // Returns once every wake so far has been acted on and the store's growth is done.
  void wait_idle();

 private:
  void loop() noexcept;
  void pin_to_target() noexcept;

  store_access store_;
  planned_bytes planned_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool dirty_ = false, busy_ = false, stop_ = false;
  std::thread thread_;
};

// Wakes the process's pinner, if there is one (the hook of vm_arena::map_new).
void note_backup_growth() noexcept;
// Waits for the process's pinner to be idle (tests).
void wait_for_background_pinning();

}  // namespace tagmem
