// backup_extents.hpp — the host memory that holds NCCL's released bytes: extents of tagmem's
// one pinned host store (runtime.hpp), so that they count in host_pinned_bytes, follow
// TAGMEM_HOST_SLAB_BYTES and the host budget, and come back to tagmem_host_trim once resumed.
//
// The extents out are counted here: stats report them, and while any is out the runtime is
// kept (tagmem_shutdown refuses), since the store they belong to must outlive them.
#pragma once

#include <cstddef>

#include "api/runtime.hpp"

namespace tagmem::nccl {

// Extents adding up to `bytes` from `store`. Throws HOST_OUT_OF_MEMORY / DRIVER, taking nothing.
meta_vector<host_extent> take_backup(host_store& store, std::size_t bytes);
// Gives `extents` back to the store. Thread-safe (late waits call it on their helper thread).
void return_backup(const meta_vector<host_extent>& extents) noexcept;
// Bytes out now.
std::size_t backup_bytes_out() noexcept;

}  // namespace tagmem::nccl
