// backup_retention.cpp — keeping a tag's BACKUP host copy across its reload (see
// backup_retention.hpp).
#include "tags/backup_retention.hpp"

#include <algorithm>

namespace tagmem {

void finish_reload_backup(tag& t, host_store& store) noexcept {
  if (t.keep_backup() && t.mode() == TAGMEM_BACKUP && !t.pieces().empty()) {
    const tag_counters& c = t.counters();
    t.set_kept(true, c.alloc_count, c.free_count);
    return;
  }
  // Note [backups given back to the system]: the store unpins extents of their own slabs.
  store.release(t.extents());
  t.extents().clear();
  t.pieces().clear();
  t.set_kept(false, 0, 0);
}

void drop_kept_backup(tag& t, host_store& store) noexcept {
  if (t.offloaded() || !t.kept()) return;
  store.release(t.extents());
  forget_kept_backup(t);
}

void forget_kept_backup(tag& t) noexcept {
  t.extents().clear();
  t.pieces().clear();
  t.set_kept(false, 0, 0);
}

bool kept_backup_current(const tag& t) noexcept {
  if (t.offloaded() || !t.kept()) return false;
  const tag_counters& c = t.counters();
  return c.alloc_count == t.kept_allocs() && c.free_count == t.kept_frees();
}

namespace {

// `extents` less the host ranges `gone` (each inside one extent).
meta_vector<host_extent> without(const meta_vector<host_extent>& extents,
                                 meta_vector<host_extent> gone) {
  std::sort(gone.begin(), gone.end(),
            [](const host_extent& a, const host_extent& b) { return a.ptr < b.ptr; });
  meta_vector<host_extent> out;
  out.reserve(extents.size() + gone.size());
  for (const host_extent& e : extents) {
    char* at = e.ptr;
    char* const end = e.ptr + e.size;
    for (const host_extent& g : gone) {
      if (g.ptr < at || g.ptr >= end) continue;
      if (g.ptr > at) out.push_back({at, std::size_t(g.ptr - at)});
      at = g.ptr + g.size;
    }
    if (at < end) out.push_back({at, std::size_t(end - at)});
  }
  return out;
}

}  // namespace

void release_freed_backup(tag& t, CUdeviceptr ptr, std::size_t size, host_store& store) noexcept {
  if (t.pieces().empty() || size == 0) return;
  if (!t.offloaded()) {
    if (!t.kept()) return;
    store.release_and_unpin(t.extents());
    forget_kept_backup(t);
    return;
  }
  if (t.partial() || t.mode() != TAGMEM_BACKUP) return;
  try {
    // The device ranges that hold no live block: the freed block's span and every segment left
    // without a live block (an offload copies whole mappings, so a segment cached before it, a
    // probe's or a freed tensor's, is in the backup too and would keep its slab pinned).
    meta_vector<std::pair<CUdeviceptr, std::size_t>> dead;
    t.pool().unused_segments(dead);
    dead.emplace_back(ptr, size);
    std::sort(dead.begin(), dead.end());
    meta_vector<backup_piece> pieces;
    meta_vector<host_extent> gone;
    pieces.reserve(t.pieces().size() + dead.size());
    for (const backup_piece& p : t.pieces()) {
      const CUdeviceptr p_end = p.dev + p.bytes;
      CUdeviceptr at = p.dev;  // what is left of the piece starts here
      for (const auto& [d, n] : dead) {
        const CUdeviceptr from = std::max(d, at);
        const CUdeviceptr to = std::min<CUdeviceptr>(d + n, p_end);
        if (from >= to) continue;
        if (at < from) pieces.push_back({at, p.host + (at - p.dev), std::size_t(from - at)});
        gone.push_back({p.host + (from - p.dev), std::size_t(to - from)});
        at = to;
      }
      if (at < p_end) pieces.push_back({at, p.host + (at - p.dev), std::size_t(p_end - at)});
    }
    if (gone.empty()) return;
    meta_vector<host_extent> extents = without(t.extents(), gone);
    t.pieces() = std::move(pieces);  // nothing below throws
    t.extents() = std::move(extents);
    store.release_and_unpin(gone);
  } catch (...) {  // no memory for the lists: the backup stays whole until the reload
  }
}

}  // namespace tagmem
