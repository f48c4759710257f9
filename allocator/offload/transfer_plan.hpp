// transfer_plan.hpp — what one offload, reload or swap will do to each tag, planned before any
// copy is queued (the engine that carries it out is offload_engine.cpp).
//
// Going out, a tag's resident mappings are walked in address order and merged into contiguous
// ranges; each range is cut into copies of at most copy_piece_bytes, also cut where a host
// extent ends. Copies therefore span mapping boundaries: their number depends on the bytes, not
// on how many segments or allocations the tag has (Note [copies span mappings]). Each mapping
// remembers how many of the tag's copies must finish before it may be unmapped.
//
// Coming in, a tag's unmapped mappings are grouped into runs (Note [reload coalescing]) and its
// backup pieces are copied once every run they overlap is mapped.
//
// Note [copies span mappings]: a virtual range mapped from several physical allocations is one
// range to the copy engines (PyTorch's expandable segments rely on the same), so a copy may cross
// mapping boundaries as long as every mapping it touches is mapped with access.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>

#include "host/host_store.hpp"
#include "tags/tag.hpp"

namespace tagmem {

struct out_mapping {
  CUdeviceptr va = 0;
  std::size_t size = 0;
  std::size_t pieces_end = 0;  // copies [0, pieces_end) cover it: they finish before the unmap
};

// One tag going out.
struct outgoing {
  tag* t = nullptr;
  std::size_t bytes = 0;             // resident bytes (copied in BACKUP mode)
  meta_vector<host_extent> extents;  // taken from the store for this offload
  meta_vector<backup_piece> pieces;  // this offload's copies, by address
  meta_vector<CUevent> done;         // recorded after each queued copy (the copy queue's)
  meta_vector<out_mapping> maps;     // resident mappings, by address
  std::size_t next_map = 0;          // maps [0, next_map) are unmapped
  std::size_t waited = 0;            // copies [0, waited) are known to have finished
  bool started = false;              // the tag holds the pieces and is marked offloaded
};

struct in_run {
  CUdeviceptr va = 0;
  std::size_t size = 0;
  meta_vector<physical_part> parts;  // while mapped
};

// One tag coming in.
struct incoming {
  tag* t = nullptr;
  meta_vector<in_run> runs;            // by address
  std::size_t mapped = 0;              // runs [0, mapped) are mapped, with access but for a
                                       // DISCARD tag's (Note [access in one call])
  std::size_t next_piece = 0;          // the tag's pieces [0, next_piece) are queued
  std::size_t copied = 0;              // bytes queued host -> device
  meta_vector<CUdeviceptr> reclaimed;  // parked mappings taken back (Note [parked mappings])
};

// Which of an out-tag's resident mappings an offload takes (all when empty).
using mapping_filter = std::function<bool(CUdeviceptr va, std::size_t bytes)>;

// Lists `o.t`'s resident mappings that `only` accepts, and their bytes (no host memory is taken
// yet).
void plan_outgoing(outgoing& o, const mapping_filter& only = {});

// Note [kept backup until planned]: a kept backup (backup_retention.hpp) of a tag going out is
// replaced by the offload's fresh one, and its host memory may serve that one; but until the
// offload has its host memory nothing may change, or an offload failing HOST_OUT_OF_MEMORY would
// lose the copy. So the host memory of all `n` out-tags is taken at once, in exchange for their
// kept backups (host_store::acquire with `replacing`), and only then are those backups forgotten.
// In BACKUP mode it then cuts each tag's copies; in other modes it only gives kept backups back.
// Throws HOST_OUT_OF_MEMORY / DRIVER with nothing taken and every kept backup still kept.
void plan_host_memory(outgoing* outs, std::size_t n, tagmem_offload_mode mode, host_store& store,
                      std::size_t piece_bytes);

// Plans `in.t`'s runs; trims a partial tag's pieces to its unmapped mappings first.
void plan_incoming(incoming& in, std::size_t max_mapping_bytes);

// Cuts the tag's backup pieces down to the parts that lie in unmapped mappings (a tag whose
// offload stopped half-way keeps only the pieces it needs).
void keep_offloaded_pieces(tag& t);

}  // namespace tagmem
