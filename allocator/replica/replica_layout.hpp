// replica_layout.hpp — whether the replicas of a tag hold the same bytes in the same layout,
// checked cheaply before any of them writes its share.
//
// Note [replica check]: the replicas compare, in one all-gather, what their tags look like: the
// sizes of the runs of mappings that lie next to each other in address order (the run the host
// copy holds, share_copy.hpp; cut the same way in every replica that made the same
// allocations), the live allocations and their bytes. In a second, each sends a checksum of
// kSamples windows of kSampleBytes at offsets drawn from a seed rank 0 chose for this offload,
// so that no fixed offsets can be missed every time. Anything that differs refuses the offload
// on every replica, naming both, before a byte moves: replicas that merely happen to have the
// same sizes are caught by the sample unless they differ only outside it, which the docs say.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tags/tag.hpp"

namespace tagmem {

inline constexpr int kSamples = 64;
inline constexpr std::size_t kSampleBytes = 4096;

struct replica_layout {
  std::vector<std::uint64_t> runs;  // bytes of each run of adjacent mappings, in address order
  std::uint64_t bytes = 0;          // their sum
  std::uint64_t allocations = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t seed = 0;   // rank 0's seed for the sample (not compared)
  std::uint64_t spare = 0;  // the token of the shared copy this replica kept, else 0 (not compared)
  std::uint32_t generation = 0;  // of that copy

  bool same_as(const replica_layout& o) const {
    return runs == o.runs && allocations == o.allocations && allocated_bytes == o.allocated_bytes;
  }
  std::string describe() const;  // "3 allocations (96 MiB) in 2 runs of mappings (128 MiB)"
};

// The layout of a resident tag; the caller holds its lock.
replica_layout layout_of(tag& t, std::uint64_t seed);
std::string encode_layout(const replica_layout& l);
replica_layout decode_layout(const std::string& payload);  // throws PEER

// A hash of what same_as() compares (Note [offload alone] in solo_offload.hpp).
std::uint64_t layout_hash(const replica_layout& l);

// The checksum of the tag's sampled windows (the context synchronised). Throws DRIVER.
std::uint64_t sampled_checksum(device& dev, tag& t, std::uint64_t seed);

}  // namespace tagmem
