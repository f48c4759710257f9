// backup_retention.hpp — keeping a tag's BACKUP host copy across its reload.
//
// A tag whose keep_backup flag is set (tagmem_set_keep_backup) keeps the pieces and extents of
// its backup when it is reloaded: the bytes it had at the offload stay in the pinned host store,
// readable through tagmem_host_view while the tag is resident, for callers that read a snapshot
// of weights after resuming them. The copy is dropped by the tag's next offload (which writes a
// fresh one), by a reload with the flag off, and it stops being handed out as soon as the tag
// allocates or frees (its allocations may no longer be the ones backed up). The tag's mutex must
// be held by the caller of each function.
#pragma once

#include "host/host_store.hpp"
#include "tags/tag.hpp"

namespace tagmem {

// The end of a reload: keeps the backup when the tag asks for it, else gives it to the store
// (which unpins a backup that lay in slabs of its own: Note [backups given back to the system]).
void finish_reload_backup(tag& t, host_store& store) noexcept;

// Whether `t`'s next offload puts its backup in slabs of its own, which go back to the system at
// its reload (Note [backups given back to the system] in host/host_store.hpp): asked for, and not
// overridden by keeping it.
inline bool gives_backup_back(const tag& t) noexcept {
  return t.unpin_backup() && !t.keep_backup();
}

// Gives a kept backup of a resident tag back to the store (before the tag is offloaded again,
// whose offload writes new pieces). Does nothing for an offloaded tag or one that keeps none.
void drop_kept_backup(tag& t, host_store& store) noexcept;

// Forgets a resident tag's kept backup whose host memory the caller has given to the store
// (noexcept: clears the records only).
void forget_kept_backup(tag& t) noexcept;

// Whether a resident tag's kept backup still describes the tag: kept, and no allocation made or
// freed in the tag since its reload.
bool kept_backup_current(const tag& t) noexcept;

// Note [a freed allocation's host copy]: once an allocation is freed, the host copy of its bytes
// is given back at once, and the slabs of the store that it leaves empty are unpinned, so a host
// address handed out for it (tagmem_host_view: torch_memory_saver's get_cpu_backup pointer, which
// its callers see unpinned after the free) is no longer pinned memory unless other backups still
// share its slab. In a tag offloaded with BACKUP the device range the free leaves without a live
// block ([ptr, ptr + size): the block with its free neighbours) is cut out of the backup, and so
// is every segment of the tag that holds no live block (an offload copies whole mappings, cached
// segments included); the reload restores the rest. A resident tag's kept backup, which the free
// makes stale (kept_backup_current), is given back whole. The offload/reload cycle itself keeps
// its slabs (Note [pin once] in host/host_store.hpp): only frees of backed-up memory unpin.
void release_freed_backup(tag& t, CUdeviceptr ptr, std::size_t size, host_store& store) noexcept;

}  // namespace tagmem
