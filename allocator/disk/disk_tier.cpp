// disk_tier.cpp — offload to and reload from files (Note [disk tier] in disk_tier.hpp).
#include "disk/disk_tier.hpp"

#include <exception>
#include <utility>

#include "offload/offload_engine.hpp"

namespace tagmem {
namespace {

disk_backup& backup_of(tag& t) { return static_cast<disk_backup&>(*t.disk_backup()); }

}  // namespace

void offload_to_disk(device& dev, tag* const* tags, std::size_t count, host_store& store,
                     const config& cfg, const disk_settings& s) {
  std::vector<std::unique_ptr<disk_backup>> backups;
  backups.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    backups.push_back(write_disk_backup(dev, *tags[i], s));  // throws: files removed, tags as were
  }
  try {
    offload_tags(dev, tags, count, TAGMEM_DISCARD, store, cfg);
  } catch (...) {
    // Tags restored resident take their bytes back from the files; partial ones keep the backup.
    for (std::size_t i = 0; i < count; ++i) {
      tag& t = *tags[i];
      if (t.offloaded()) {
        t.disk_backup() = std::move(backups[i]);
        t.set_offload_mode(TAGMEM_BACKUP_DISK);
        continue;
      }
      try {
        read_disk_backup(dev, *backups[i], s);
      } catch (...) {  // the offload's own error is the one to report
      }
    }
    throw;
  }
  for (std::size_t i = 0; i < count; ++i) {
    tag& t = *tags[i];
    t.counters().bytes_offloaded += backups[i]->bytes;
    t.disk_backup() = std::move(backups[i]);
    t.set_offloaded(TAGMEM_BACKUP_DISK);
  }
}

void reload_from_disk(device& dev, tag* const* tags, std::size_t count, host_store& store,
                      const config& cfg, const disk_settings& s) {
  std::exception_ptr first;
  for (std::size_t i = 0; i < count; ++i) tags[i]->set_offload_mode(TAGMEM_DISCARD);
  // The mappings come back as they were, not coalesced (Note [reload coalescing]): nothing is
  // gained by larger mappings here, where the reads, not the maps, set a disk reload's time.
  config as_they_were = cfg;
  as_they_were.max_mapping_bytes = 0;
  as_they_were.discard_mapping_bytes = 0;
  try {
    reload_tags(dev, tags, count, store, as_they_were);  // tags before a failing one: resident
  } catch (...) {
    first = std::current_exception();
  }
  for (std::size_t i = 0; i < count; ++i) {
    tag& t = *tags[i];
    if (t.offloaded()) {  // not mapped: the backup is untouched
      t.set_offload_mode(TAGMEM_BACKUP_DISK);
      continue;
    }
    disk_backup& b = backup_of(t);
    try {
      read_disk_backup(dev, b, s);
      t.counters().bytes_reloaded += b.bytes;
      t.disk_backup().reset();  // the files go: the tag is resident
      continue;
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    // The bytes are not all back: unmap again and keep the files (retryable).
    try {
      offload_tags(dev, &tags[i], 1, TAGMEM_DISCARD, store, cfg);
      t.counters().offload_count--;  // neither the reload nor this offload happened
      t.counters().reload_count--;
    } catch (...) {  // left partial (or resident) by the pipeline: the backup stays with it
    }
    if (t.offloaded()) t.set_offload_mode(TAGMEM_BACKUP_DISK);
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace tagmem
