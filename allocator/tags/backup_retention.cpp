// backup_retention.cpp — keeping a tag's BACKUP host copy across its reload (see
// backup_retention.hpp).
#include "tags/backup_retention.hpp"

namespace tagmem {

void finish_reload_backup(tag& t, host_store& store) noexcept {
  if (t.keep_backup() && t.mode() == TAGMEM_BACKUP && !t.pieces().empty()) {
    const tag_counters& c = t.counters();
    t.set_kept(true, c.alloc_count, c.free_count);
    return;
  }
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

}  // namespace tagmem
