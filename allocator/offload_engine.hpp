// offload_engine.hpp — moves tags' bytes between device and the pinned host store.
//
// The caller (the registry) has validated the request and holds the lock of every tag passed in.
#pragma once

#include "host_store.hpp"
#include "tag.hpp"

namespace tagmem {

// Offloads `tags` (all on `dev`, each resident or partial) in `mode`. On failure before any
// unmapping every tag is unchanged; a failure while unmapping leaves the tag it hit partial
// (see tag.hpp) and the later tags resident. Throws the failure.
void offload_tags(device& dev, tag* const* tags, std::size_t count, tagmem_offload_mode mode,
                  host_store& store, const config& cfg);

// Reloads one offloaded tag. On failure the tag stays offloaded with its backup intact.
void reload_tag(device& dev, tag& t, host_store& store, const config& cfg);

}  // namespace tagmem
