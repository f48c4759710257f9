// tag.hpp — one tag on one device: its arena, its sub-allocator, its offload state and counters.
//
// A tag is resident (every mapping mapped) or offloaded. Offload state lives per mapping
// (vm_arena's `resident` flag) so that an offload interrupted by a driver failure leaves a
// consistent record of which bytes are where (`partial_`), and a later offload or reload picks
// up from there: nothing is lost. All members are guarded by mutex_, which callers hold across
// every call into the tag.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "device/block_pool.hpp"
#include "device/vm_arena.hpp"
#include "host/host_store.hpp"
#include "transfer/copy_queue.hpp"  // backup_piece: where one range of an offloaded tag waits

namespace tagmem {

struct tag_counters {
  std::uint64_t alloc_count = 0;
  std::uint64_t free_count = 0;
  std::uint64_t offload_count = 0;
  std::uint64_t reload_count = 0;
  std::uint64_t bytes_offloaded = 0;
  std::uint64_t bytes_reloaded = 0;
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_mapped_bytes = 0;
};

// What a layer above keeps with a tag and what goes when the tag goes (the disk tier's backup
// files, disk/disk_backup.hpp; a replicated tag's setting and shared host copy,
// replica/replication.hpp).
struct tag_attachment {
  virtual ~tag_attachment() = default;
  // Host memory this attachment holds for the tag's backup now (counted in its host_bytes).
  virtual std::size_t host_bytes() const noexcept { return 0; }
};

class tag : public meta_object {
 public:
  tag(device& dev, const config& cfg, const char* name);
  ~tag() = default;
  tag(const tag&) = delete;
  tag& operator=(const tag&) = delete;

  const char* name() const noexcept { return name_.c_str(); }
  device& dev() noexcept { return dev_; }
  std::mutex& mutex() noexcept { return mutex_; }

  vm_arena& arena() noexcept { return arena_; }
  block_pool& pool() noexcept { return pool_; }
  tag_counters& counters() noexcept { return counters_; }
  const tag_counters& counters() const noexcept { return counters_; }

  bool offloaded() const noexcept { return offloaded_; }
  // Offloaded, some mappings still resident: an offload that stopped part way, which a later
  // offload finishes. One whose failure left nothing mapped (a restore that could not map the
  // bytes back) is plainly offloaded, as the caller sees it: offloading it again is TAG_OFFLOADED.
  bool partial() const noexcept { return partial_ && arena_.mapped_bytes() != 0; }
  tagmem_offload_mode mode() const noexcept { return mode_; }
  // Planned to be offloaded with BACKUP: its growth is pinned ahead (Note [pin ahead]).
  bool pins_ahead() const noexcept { return arena_.pins_ahead(); }
  void set_pins_ahead(bool on) noexcept { arena_.set_pins_ahead(on); }
  tagmem_tag_state state() const noexcept;

  // Backup bookkeeping, used by the offload engine.
  meta_vector<backup_piece>& pieces() noexcept { return pieces_; }
  meta_vector<host_extent>& extents() noexcept { return extents_; }
  std::size_t host_bytes() const noexcept;
  void set_offloaded(tagmem_offload_mode mode) noexcept;
  void set_partially_offloaded(tagmem_offload_mode mode) noexcept;  // see partial()
  void set_resident() noexcept;
  // Labels an offloaded tag with `mode`, partial or not as it is: a tier above the pipeline
  // (disk, replicas) has it see a DISCARD tag and callers its own mode.
  void set_offload_mode(tagmem_offload_mode mode) noexcept;

  // Keeping the backup across a reload (backup_retention.hpp): the flag the caller set, and
  // whether a resident tag holds a kept backup, with the tag's allocation and free counts when
  // it was kept.
  bool keep_backup() const noexcept { return keep_backup_; }
  void set_keep_backup(bool keep) noexcept { keep_backup_ = keep; }
  // Whether its reloads give the backup's host memory back to the system (tagmem_set_unpin_backup,
  // Note [backups given back to the system] in host/host_store.hpp).
  bool unpin_backup() const noexcept { return unpin_backup_; }
  void set_unpin_backup(bool unpin) noexcept { unpin_backup_ = unpin; }
  bool kept() const noexcept { return kept_; }
  std::uint64_t kept_allocs() const noexcept { return kept_allocs_; }
  std::uint64_t kept_frees() const noexcept { return kept_frees_; }
  void set_kept(bool kept, std::uint64_t allocs, std::uint64_t frees) noexcept {
    kept_ = kept;
    kept_allocs_ = allocs;
    kept_frees_ = frees;
  }

  // The tag's disk backup while it is offloaded to disk (TAGMEM_BACKUP_DISK), else null.
  std::unique_ptr<tag_attachment>& disk_backup() noexcept { return disk_backup_; }
  // The tag's replication (replica/replication.hpp) when it is a replicated tag, else null.
  std::unique_ptr<tag_attachment>& replication() noexcept { return replication_; }

  tagmem_tag_stats stats() const;
  // Raises the peaks to the bytes allocated and mapped now (after an allocation; mapped bytes
  // grow only then, a reload restores at most what was mapped).
  void note_peaks() noexcept;

 private:
  meta_string name_;
  device& dev_;
  std::mutex mutex_;
  vm_arena arena_;
  block_pool pool_;
  tag_counters counters_;
  bool offloaded_ = false;
  bool partial_ = false;
  tagmem_offload_mode mode_ = TAGMEM_BACKUP;
  meta_vector<backup_piece> pieces_;  // sorted by device address
  meta_vector<host_extent> extents_;  // host store extents the pieces live in
  bool keep_backup_ = false;
  bool unpin_backup_ = false;
  bool kept_ = false;
  std::uint64_t kept_allocs_ = 0, kept_frees_ = 0;
  std::unique_ptr<tag_attachment> disk_backup_;
  std::unique_ptr<tag_attachment> replication_;
};

}  // namespace tagmem
