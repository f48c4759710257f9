// config.hpp — the settings tagmem runs with, from tagmem_config and TAGMEM_* variables.
//
// A field set in tagmem_config wins; a zero field takes the environment variable, then the
// default. Environment only: TAGMEM_HOST_SLAB_BYTES, TAGMEM_DISCARD_MAPPING_BYTES,
// TAGMEM_COPY_STREAMS, TAGMEM_DISCARD_RELEASE (background|wait), TAGMEM_SWAP_RELEASE
// (background|inline), TAGMEM_METADATA. Values are checked once at init (INVALID_ARGUMENT names
// the bad one).
#pragma once

#include <cstddef>

#include "tagmem/tagmem.h"

namespace tagmem {

enum class metadata_allocator { mimalloc, system };

struct config {
  std::size_t chunk_bytes = 2ull << 20;             // small-request segments
  std::size_t large_segment_bytes = 20ull << 20;    // segments for 1 MiB < request <= 10 MiB
  std::size_t arena_bytes = 256ull << 30;           // VA reserved per tag, per reservation
  std::size_t copy_piece_bytes = 64ull << 20;       // one offload/reload copy
  std::size_t max_mapping_bytes = 1ull << 30;       // largest coalesced physical allocation
  std::size_t discard_mapping_bytes = 16ull << 30;  // the same for a DISCARD tag's reload
  std::size_t host_slab_bytes = 256ull << 20;       // pinned host store grows by this at least
  std::size_t host_max_bytes = 0;                   // cap on that store; 0: none (host_budget.hpp)
  int copy_streams = 2;                             // per direction, per device
  bool background_release = true;                   // Note [background release]
  bool swap_background_release = true;              // TAGMEM_SWAP_RELEASE (background|inline)
  metadata_allocator metadata = metadata_allocator::mimalloc;  // TAGMEM_METADATA
};

// Builds the configuration; throws INVALID_ARGUMENT on a bad value.
config make_config(const tagmem_config* user);

}  // namespace tagmem
