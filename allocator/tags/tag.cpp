// tag.cpp — state and statistics of one tag (see tag.hpp).
#include "tags/tag.hpp"

#include <algorithm>

#include "device/device.hpp"

namespace tagmem {

tag::tag(device& dev, const config& cfg, const char* name)
    : name_(name), dev_(dev), arena_(dev, cfg, this), pool_(arena_, cfg) {}

tagmem_tag_state tag::state() const noexcept {
  if (!offloaded_) return TAGMEM_RESIDENT;
  if (mode_ == TAGMEM_BACKUP_DISK) return TAGMEM_OFFLOADED_DISK;
  return mode_ == TAGMEM_BACKUP ? TAGMEM_OFFLOADED_BACKUP : TAGMEM_OFFLOADED_DISCARD;
}

std::size_t tag::host_bytes() const noexcept {
  std::size_t n = 0;
  for (const host_extent& e : extents_) n += e.size;
  if (replication_) n += replication_->host_bytes();
  return n;
}

void tag::set_offloaded(tagmem_offload_mode mode) noexcept {
  offloaded_ = true;
  partial_ = false;
  mode_ = mode;
}

void tag::set_partially_offloaded(tagmem_offload_mode mode) noexcept {
  set_offloaded(mode);
  partial_ = true;
}

void tag::set_offload_mode(tagmem_offload_mode mode) noexcept {
  if (partial()) {
    set_partially_offloaded(mode);
  } else {
    set_offloaded(mode);
  }
}

void tag::set_resident() noexcept {
  offloaded_ = false;
  partial_ = false;
}

tagmem_tag_stats tag::stats() const {
  tagmem_tag_stats s{};
  const pool_totals& t = pool_.totals();
  s.state = state();
  s.allocated_bytes = t.allocated_bytes;
  s.requested_bytes = t.requested_bytes;
  s.reserved_bytes = t.reserved_bytes;
  s.live_allocations = t.live_allocations;
  s.mapped_bytes = arena_.mapped_bytes();
  s.virtual_bytes = arena_.virtual_bytes();
  // Physical allocations: a resident record may hold several (Note [physical recycling]).
  for (const auto& [va, m] : arena_.mappings()) s.mappings += m.resident ? m.parts.size() : 1;
  s.host_bytes = host_bytes();
  s.alloc_count = counters_.alloc_count;
  s.free_count = counters_.free_count;
  s.offload_count = counters_.offload_count;
  s.reload_count = counters_.reload_count;
  s.bytes_offloaded = counters_.bytes_offloaded;
  s.bytes_reloaded = counters_.bytes_reloaded;
  s.peak_allocated_bytes = std::max(counters_.peak_allocated_bytes, s.allocated_bytes);
  s.peak_mapped_bytes = std::max(counters_.peak_mapped_bytes, s.mapped_bytes);
  // Note [parked mappings]: still mapped, but the recycler's to hand on, not the tag's.
  if (offloaded_) s.parked_bytes = dev_.recycler().parked_bytes_at(arena_.mappings());
  return s;
}

void tag::note_peaks() noexcept {
  counters_.peak_allocated_bytes =
      std::max(counters_.peak_allocated_bytes, pool_.totals().allocated_bytes);
  counters_.peak_mapped_bytes = std::max(counters_.peak_mapped_bytes, arena_.mapped_bytes());
}

}  // namespace tagmem
