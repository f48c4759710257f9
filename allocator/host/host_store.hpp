// host_store.hpp — the process-wide pinned host memory that holds BACKUP tags' bytes.
//
// Note [pin once]: pinning host memory costs far more than copying through it (docs/performance.md,
// "Pinning"), so the store pins slabs once and keeps them: an offload takes extents from free slab
// space, a reload gives them back, and later cycles reuse the same pinned pages; steady state pins
// and unpins nothing, so the high-water mark stays flat from the second cycle on. Slabs are only
// unpinned by trim(), release_and_unpin() (a freed allocation's copy) and destruction. Growing pins
// several slabs at once on several threads (Note [pinning method] in host_pinning.hpp); reserve()
// does it ahead of need on a background thread, and acquire() waits for that thread only while free
// space falls short of its request. The store never grows past its host budget (Note [host budget]
// in host_budget.hpp): a growth that does not fit fails before a page is touched.
//
// Note [backups given back to the system]: a tag can ask for the opposite of pin once
// (tagmem_set_unpin_backup: torch_memory_saver's "mmap" backend promises that a region's host
// memory goes back after its resume). Its extents come from slabs of their own, which hold no
// other kind of backup, pinned to the size asked rather than a whole slab, so that release() can
// unpin them whole once the reload gives them back, without touching the slabs that other tags
// keep pinned for their next offload. Where a backup lies decides, not the tag's flag at its
// reload: a flag cleared after the offload still gives that backup's memory back, and one set
// after it leaves the shared slabs pinned.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>

#include "host/host_budget.hpp"
#include "host/host_pinning.hpp"
#include "host/metadata_heap.hpp"

namespace tagmem {

struct host_extent {
  char* ptr = nullptr;
  std::size_t size = 0;
};

struct host_store_stats {
  std::size_t pinned_bytes = 0;  // slabs held
  std::size_t high_water = 0;    // most ever held
  std::size_t used_bytes = 0;    // handed out in extents
  std::size_t budget_bytes = 0;  // the most it may hold now (Note [host budget])
};

class host_store {
 public:
  // Reads TAGMEM_HOST_PIN and TAGMEM_HOST_PIN_THREADS (throws INVALID_ARGUMENT). max_bytes caps
  // the store (TAGMEM_HOST_MAX_BYTES; 0: only the default budget of Note [host budget] applies).
  host_store(std::size_t slab_bytes, CUcontext context, std::size_t max_bytes = 0);
  // Stops background pinning after its current slabs and unpins every slab (one that cannot
  // be unpinned stays pinned and mapped: Note [unpin keeps what it cannot release]).
  ~host_store();
  host_store(const host_store&) = delete;
  host_store& operator=(const host_store&) = delete;

  // Extents adding up to exactly `bytes`, pinning what free space lacks. Throws
  // HOST_OUT_OF_MEMORY / DRIVER with nothing taken (slabs pinned on the way stay in the store).
  meta_vector<host_extent> acquire(std::size_t bytes);
  // The same, in exchange for `replacing` (extents the caller holds, given back only when the
  // new ones are taken, so that they may serve the request): on success the caller no longer
  // holds them; on a throw it still does, their bytes untouched. The request is served from
  // `replacing` first, in its order, so that a copy rewritten in place keeps its host address
  // (callers hold on to it: tagmem_host_view of a kept backup).
  meta_vector<host_extent> acquire(std::size_t bytes, const meta_vector<host_extent>& replacing);
  // Extents adding up to exactly `bytes` from slabs that serve only such requests (Note [backups
  // given back to the system]), pinning what they lack. Throws as acquire() does.
  meta_vector<host_extent> acquire_returned(std::size_t bytes);
  // Gives `extents` back. Those from acquire_returned() leave their slabs pinned no longer than
  // this: each such slab is unpinned once it holds no extent.
  void release(const meta_vector<host_extent>& extents) noexcept;
  // Gives `extents` back as release() does, then unpins each slab they lay in that holds no
  // extent any more, so that their host addresses are no longer pinned (Note [a freed
  // allocation's host copy] in tags/backup_retention.hpp). Not for the offload/reload cycle, which
  // keeps its slabs (Note [pin once]). A slab whose unpin fails stays pinned and free for use;
  // the failure is dropped, as nothing was lost.
  void release_and_unpin(const meta_vector<host_extent>& extents) noexcept;

  // How reserve() grows the store.
  enum class growth { now, in_background };
  // Grows the store to at least `bytes` in total, now or on a background thread (a failure there
  // is dropped: the next acquire pins what it needs and reports its own). Throws
  // HOST_OUT_OF_MEMORY when that is beyond the budget, DRIVER.
  void reserve(std::size_t bytes, growth how);
  // Unpins slabs that hold no extent as long as at least keep_bytes stay pinned; cancels
  // background growth beyond keep_bytes. Throws DRIVER naming the failed call when a slab cannot
  // be unpinned: that slab stays pinned and free for use, the others are unpinned (Note [trim
  // keeps what it cannot unpin], host_store.cpp).
  void trim(std::size_t keep_bytes);

  host_store_stats stats();

  // Where the figures of Note [host budget] come from: read_host_memory() unless a test gives
  // its own (called without the store's lock, on the thread that grows the store).
  using memory_source = host_memory (*)(void* context);
  void set_memory_source(memory_source source, void* context) noexcept;

 private:
  struct slab {
    std::size_t size;
    std::size_t used;       // bytes handed out from it
    bool returned = false;  // serves acquire_returned() only
  };
  // Pins at least `need` bytes more (the rest of a slab when the budget allows; exactly `need`,
  // rounded to pages, for `returned` slabs) on this thread's helpers; call without the lock.
  // `asked` and `what` name the request for the error message.
  void grow(std::size_t need, std::size_t asked, const char* what, bool returned = false);
  std::size_t claim(std::size_t need, std::size_t asked, const char* what, bool returned);
  // Adds to `added` under the lock.
  void add_slab(pinned_slab r, std::size_t& added, bool returned);
  // Returns whether the range lay in a slab of acquire_returned()'s class.
  bool give_back_locked(char* ptr, std::size_t size);
  // give_back_locked() for each extent, under the lock; whether any lay in such a slab.
  bool give_back(const meta_vector<host_extent>& extents) noexcept;
  // Unpins the slabs that `extents` lay in and that hold no extent now (only acquire_returned()'s
  // where `returned_only`); a failure leaves them pinned and free. Call without the lock.
  void unpin_emptied(const meta_vector<host_extent>& extents, bool returned_only) noexcept;
  std::size_t free_bytes_locked() const;
  std::size_t free_returned_locked() const;  // free bytes in returned slabs
  // Takes `bytes` from the free ranges of the slabs of class `returned` (there are enough).
  void take_locked(std::size_t bytes, bool returned, meta_vector<host_extent>& out);
  // Note [host budget], counting `pinned` as pinned.
  std::size_t budget_locked(std::size_t headroom, std::size_t pinned) const;
  // The figures of Note [host budget] and what was pinned just before they were read; takes
  // the lock briefly, so call without it.
  struct memory_reading {
    host_memory memory;
    std::size_t pinned_before = 0;
  };
  memory_reading read_memory();
  // Calls prepare(lock) under the lock, then unpins the slabs that pick(base, size) chooses
  // among those holding no extent; throws DRIVER naming the failed call (Note [trim keeps what
  // it cannot unpin], host_store.cpp).
  template <class Prepare, class Pick>
  void unpin_free_slabs(Prepare prepare, Pick pick);
  void background_loop();
  void stop_background(std::unique_lock<std::mutex>& lock);

  std::size_t slab_bytes_;
  std::size_t max_bytes_;  // 0: none
  CUcontext context_;      // current while pinning (any context will do: slabs are PORTABLE)
  pin_method method_;
  unsigned threads_;
  std::mutex mutex_;
  std::condition_variable changed_;  // a slab was added or background pinning stopped
  std::thread background_;
  bool background_running_ = false;
  std::size_t target_bytes_ = 0;       // what background pinning grows the store to
  std::size_t growing_ = 0;            // claimed by growths under way, not yet in a slab
  meta_map<char*, slab> slabs_;        // by base
  meta_map<char*, std::size_t> free_;  // free ranges, by address, coalesced within slabs
  host_store_stats stats_;
  memory_source memory_source_ = nullptr;  // null: read_host_memory()
  void* memory_context_ = nullptr;
};

}  // namespace tagmem
