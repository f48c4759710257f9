// share_copy.hpp — a replicated tag's bytes as one run, and copies of parts of it.
//
// The tag's mappings, in address order and back to back, are the run: the host copy holds it
// at the same offsets in every replica (the replicas' layouts were found equal first,
// replica_layout.hpp). Copies are synchronous, in pieces of at most kCopyPieceBytes, in the
// device's context; the caller has synchronised the context before reading device bytes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>

#include "tags/tag.hpp"

namespace tagmem {

inline constexpr std::size_t kCopyPieceBytes = std::size_t{256} << 20;

// The bytes of the tag's mappings (resident or not).
std::size_t run_bytes(tag& t) noexcept;

// Calls each(device address, offset in the run, bytes) for the parts of [begin, end) of the
// run, in order, each within one mapping and at most kCopyPieceBytes.
void for_each_part(tag& t, std::size_t begin, std::size_t end,
                   const std::function<void(CUdeviceptr, std::size_t, std::size_t)>& each);

// Copies [begin, end) of the run from the device to [host, host + end - begin). Throws DRIVER.
void copy_to_host(device& dev, tag& t, std::size_t begin, std::size_t end, char* host);

// Copies the whole run from `host` to the device (every mapping must be mapped). Throws DRIVER.
void copy_to_device(device& dev, tag& t, const char* host);

}  // namespace tagmem
