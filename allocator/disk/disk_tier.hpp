// disk_tier.hpp — offloading tags to files and reloading them (TAGMEM_BACKUP_DISK).
//
// Note [disk tier]: the disk tier sits on the offload pipeline rather than in it. Offloading, it
// first writes each tag's live allocations to files while the tag is still resident and untouched
// (disk_backup.hpp; free memory in its mappings is not written), then has the pipeline offload the
// tags as DISCARD, which unmaps and gives the memory back without a host copy; the backup goes with
// the tag and the tag reads as OFFLOADED_DISK. Reloading, the pipeline maps the tag back as it does
// a DISCARD tag, then the files are read into it. Each failure leaves the bytes somewhere:
//  - a write fails (ENOSPC, EIO, no progress, the directory missing): the tag was never touched;
//    it stays resident and the files made so far are removed;
//  - the pipeline's offload fails: a tag it restored is resident again and gets its bytes back
//    from the files; one it left partial keeps the backup and stays offloaded to disk;
//  - mapping on reload fails: the tag stays offloaded to disk, backup intact, retryable;
//  - a read fails or a checksum differs: the tag is unmapped again and stays offloaded to disk
//    with its files, so a reload can be retried (a truncated file fails again: those bytes are
//    gone, and the error says which file).
// After a reload the files are removed: the host holds no copy of a resident tag.
#pragma once

#include <cstddef>

#include "disk/disk_backup.hpp"
#include "host/host_store.hpp"
#include "tags/tag.hpp"

namespace tagmem {

// Offloads resident, whole tags (the caller holds their locks) to files; see Note [disk tier].
void offload_to_disk(device& dev, tag* const* tags, std::size_t count, host_store& store,
                     const config& cfg, const disk_settings& s);

// Reloads tags offloaded to disk (the caller holds their locks); see Note [disk tier]. Every tag
// is attempted; the first failure is thrown once all were.
void reload_from_disk(device& dev, tag* const* tags, std::size_t count, host_store& store,
                      const config& cfg, const disk_settings& s);

}  // namespace tagmem
