// host_store.hpp — the process-wide pinned host memory that holds BACKUP tags' bytes.
//
// Note [pin once]: pinning host memory costs far more than copying through it (DESIGN.md: 4 GiB
// took 4.3 s to cudaHostAlloc, against ~75 ms to copy), so the store pins slabs once and keeps
// them: an offload takes extents from free slab space, a reload gives them back, and later
// cycles reuse the same pinned pages. Slabs are only unpinned by trim(). reserve() grows the
// store ahead of need on a background thread.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

#include "metadata_heap.hpp"

namespace tagmem {

struct host_extent {
  char* ptr = nullptr;
  std::size_t size = 0;
};

struct host_store_stats {
  std::size_t pinned_bytes = 0;  // slabs held
  std::size_t high_water = 0;    // most ever held
  std::size_t used_bytes = 0;    // handed out in extents
};

class host_store {
 public:
  host_store(std::size_t slab_bytes, CUcontext context);
  ~host_store();  // waits for background pinning, frees every slab
  host_store(const host_store&) = delete;
  host_store& operator=(const host_store&) = delete;

  // Extents adding up to exactly `bytes`, pinning a new slab for what free space lacks.
  // Throws HOST_OUT_OF_MEMORY / DRIVER with nothing taken.
  meta_vector<host_extent> acquire(std::size_t bytes);
  void release(const meta_vector<host_extent>& extents) noexcept;

  // Grows the store to at least `bytes` in total; with wait=false on a background thread.
  void reserve(std::size_t bytes, bool wait);
  // Frees slabs that hold no extent while the store is larger than keep_bytes.
  void trim(std::size_t keep_bytes);

  host_store_stats stats();

 private:
  struct slab {
    char* base;
    std::size_t size;
    std::size_t used;  // bytes handed out from it
  };
  char* pin(std::size_t bytes);  // throws
  void unpin(char* p) noexcept;
  void add_slab_locked(char* base, std::size_t size);
  void give_back_locked(char* ptr, std::size_t size);
  void wait_background(std::unique_lock<std::mutex>& lock);

  std::size_t slab_bytes_;
  CUcontext context_;  // current while pinning (any context will do)
  std::mutex mutex_;
  std::condition_variable background_done_;
  bool background_running_ = false;
  std::thread background_;
  meta_map<char*, slab> slabs_;        // by base
  meta_map<char*, std::size_t> free_;  // free ranges, by address, coalesced within slabs
  host_store_stats stats_;
};

}  // namespace tagmem
