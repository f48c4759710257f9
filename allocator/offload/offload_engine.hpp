// offload_engine.hpp — moves tags' bytes between the device and the pinned host store.
//
// One pipeline serves offload, reload, several tags at once and swap (some tags out while
// others come in): see offload_engine.cpp. The caller (the registry) has validated the request
// and holds the lock of every tag passed in: `outs` are resident or partial, `ins` offloaded,
// the two lists disjoint, all on `dev`.
#pragma once

#include <functional>

#include "host/host_store.hpp"
#include "offload/transfer_plan.hpp"
#include "tags/tag.hpp"

namespace tagmem {

// Offloads `outs` in `mode` and reloads `ins` at the same time. Outcomes:
//  - success: every out-tag offloaded, every in-tag resident with its bytes restored;
//  - a failure on the out side (host memory, a copy, an unmap): no in-tag changes, every
//    out-tag is resident again with its bytes (or, if even that fails, partial: its unmapped
//    mappings backed up, nothing lost); throws it;
//  - a failure on the in side (device memory, a driver call): the out side completes; the
//    in-tags before the failing one are reloaded, it and those after stay offloaded with their
//    backups intact; throws it.
// `queued`, when set, is called once every out-tag's copies are queued and before anything is
// unmapped (Note [early return] in registry/early_offloads.hpp): a failure before it leaves every
// tag as it was; it is not called when there is no out side.
void move_tags(device& dev, tag* const* outs, std::size_t out_count, tagmem_offload_mode mode,
               tag* const* ins, std::size_t in_count, host_store& store, const config& cfg,
               const std::function<void()>& queued = {});

inline void offload_tags(device& dev, tag* const* tags, std::size_t count, tagmem_offload_mode mode,
                         host_store& store, const config& cfg,
                         const std::function<void()>& queued = {}) {
  move_tags(dev, tags, count, mode, nullptr, 0, store, cfg, queued);
}

// Unmaps, as a DISCARD offload of `t` would, only its resident mappings that `only` accepts; the
// others stay resident and the tag is offloaded, partial while any remain (a tier above the
// pipeline finishes it: Note [offload alone] in replica/solo_offload.hpp). Counts no offload.
void discard_mappings(device& dev, tag& t, const mapping_filter& only, host_store& store,
                      const config& cfg);

inline void reload_tags(device& dev, tag* const* tags, std::size_t count, host_store& store,
                        const config& cfg) {
  move_tags(dev, nullptr, 0, TAGMEM_BACKUP, tags, count, store, cfg);
}

}  // namespace tagmem
