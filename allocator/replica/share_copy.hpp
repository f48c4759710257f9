// share_copy.hpp — a replicated tag's bytes as one run, and copies of parts of it.
//
// The tag's mappings, in address order and back to back, are the run: the host copy holds it
// at the same offsets in every replica (the replicas' layouts were found equal first,
// replica_layout.hpp). Copies go through the device's copy queue (transfer/copy_queue.hpp), in
// pieces of at most `piece_bytes` (TAGMEM_COPY_PIECE_BYTES) over its copy streams, as every
// offload's and reload's do, and are complete when the call returns; the caller has synchronised
// the context before reading device bytes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "tags/tag.hpp"

namespace tagmem {

class shared_buffer;

// The bytes of the tag's mappings (resident or not).
std::size_t run_bytes(tag& t) noexcept;

// Calls each(device address, offset in the run, bytes) for the parts of [begin, end) of the
// run, in order, each within one mapping and at most `piece_bytes`.
void for_each_part(tag& t, std::size_t begin, std::size_t end, std::size_t piece_bytes,
                   const std::function<void(CUdeviceptr, std::size_t, std::size_t)>& each);

// Copies [begin, end) of the run from the device to [host, host + end - begin), pinned memory.
// Throws DRIVER.
void copy_to_host(device& dev, tag& t, std::size_t begin, std::size_t end, char* host,
                  std::size_t piece_bytes);

// Copies [begin, end) of the run from [host, host + end - begin), pinned memory, to the device
// (the mappings there must be mapped). Throws DRIVER.
void copy_to_device(device& dev, tag& t, std::size_t begin, std::size_t end, const char* host,
                    std::size_t piece_bytes);

// Copies share k of the run into `copy` and marks it written by offload `generation`; returns
// its bytes. Throws DRIVER (the share is then not marked).
std::size_t copy_share(device& dev, tag& t, shared_buffer& copy, int k, std::uint32_t generation,
                       std::size_t piece_bytes);

}  // namespace tagmem
