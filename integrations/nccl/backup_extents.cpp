// backup_extents.cpp — NCCL's backups in the host store, counted (see backup_extents.hpp).
#include "backup_extents.hpp"

#include <atomic>

namespace tagmem::nccl {
namespace {
std::atomic<std::size_t> g_out{0};
}  // namespace

meta_vector<host_extent> take_backup(host_store& store, std::size_t bytes) {
  meta_vector<host_extent> out = store.acquire(bytes);
  g_out += bytes;
  return out;
}

void return_backup(const meta_vector<host_extent>& extents) noexcept {
  if (extents.empty()) return;
  std::size_t bytes = 0;
  for (const host_extent& e : extents) bytes += e.size;
  // The store exists: the runtime is kept while any extent is out.
  if (host_store* store = runtime::store_if_started()) store->release(extents);
  g_out -= bytes;
}

std::size_t backup_bytes_out() noexcept { return g_out.load(); }

}  // namespace tagmem::nccl
