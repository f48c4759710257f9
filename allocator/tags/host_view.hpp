// host_view.hpp — finding an offloaded allocation's bytes in the pinned host store.
//
// A BACKUP offload leaves the tag with backup pieces (device range -> host range), sorted by
// device address (and a reload may keep them: backup_retention.hpp); tagmem_host_view() hands
// out the host side of one of them. The tag's mutex
// must be held by the caller, since an offload or reload rewrites the pieces under it.
#pragma once

#include <cstddef>

#include "tags/tag.hpp"

namespace tagmem {

struct host_span {
  char* host = nullptr;
  std::size_t bytes = 0;
};

// The host bytes of [address, end): the piece holding `address`, extended over following pieces
// that continue it both on the device and on the host, cut at `end`. Throws TAG_RESIDENT /
// TAG_OFFLOADED when the tag holds no complete backup (a resident tag's current kept backup
// counts, for reading only), INTERNAL when no piece covers `address`.
host_span backup_span(tag& t, CUdeviceptr address, CUdeviceptr end, bool writable);

}  // namespace tagmem
