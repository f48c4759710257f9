// config.hpp — the settings tagmem runs with, from tagmem_config and the TAGMEM_* settings.
//
// A field set in tagmem_config wins; a zero field takes the environment variable, then the
// default (both from options/options.def). Values are checked once, at init: INVALID_ARGUMENT
// names the bad one.
#pragma once

#include <cstddef>

#include "tagmem/tagmem.h"

namespace tagmem {

enum class metadata_allocator { mimalloc, system };
// TAGMEM_RECYCLE_PHYSICAL (Note [physical recycling] in physical_recycler.hpp).
enum class recycling { swap, keep, off };
// TAGMEM_COPY_KERNEL (Note [copy kernel] in kernel_copy.hpp).
enum class copy_kernel_use { after_release, always, off };

struct config {
  // Each field is the setting of the same name in options.def; make_config fills them in.
  std::size_t chunk_bytes = 0;
  std::size_t large_segment_bytes = 20ull << 20;  // segments for 1 MiB < request <= 10 MiB
  std::size_t arena_bytes = 0;
  std::size_t copy_piece_bytes = 0;
  std::size_t max_mapping_bytes = 0;
  std::size_t discard_mapping_bytes = 0;  // for a DISCARD tag's reload
  std::size_t host_slab_bytes = 0;        // the pinned host store grows by this at least
  std::size_t host_max_bytes = 0;         // cap on that store; 0: none (host_budget.hpp)
  std::size_t disk_piece_bytes = 0;       // the disk tier (disk/disk_backup.hpp)
  std::size_t disk_file_bytes = 0;
  int disk_depth = 0;
  int copy_streams = 0;             // per direction, per device
  bool background_release = false;  // Note [background release]
  bool swap_background_release = false;
  recycling recycle = recycling::swap;
  bool pin_ahead = true;  // Note [pin ahead] in background_pinning.hpp
  copy_kernel_use copy_kernel = copy_kernel_use::after_release;
  metadata_allocator metadata = metadata_allocator::mimalloc;
  // Handoff between processes of one job (Note [handoff] in handoff/service.hpp).
  bool handoff = false;
  bool handoff_after_offload = true;  // TAGMEM_HANDOFF_ANNOUNCE=after_offload
  int handoff_wait_ms = 0;
  int handoff_hold_ms = 0;
  bool handoff_map_ahead = true;  // Note [mapped ahead]
  int handoff_timeout_ms = 0;
  bool handoff_give_way = true;         // Note [copies give way] in offload/give_way.hpp
  bool offload_return_queued = false;   // TAGMEM_OFFLOAD_RETURN=queued (Note [early return])
  bool discard_access_per_run = false;  // TAGMEM_DISCARD_ACCESS=per_run (Note [access in one call])
  // Device memory created exportable, for IPC (Note [ipc] in handoff/ipc_server.hpp).
  bool ipc = true;
};

// Builds the configuration; throws INVALID_ARGUMENT on a bad value.
config make_config(const tagmem_config* user);

}  // namespace tagmem
