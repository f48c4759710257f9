// checksum.hpp — the 64-bit checksum tagmem keeps of bytes it moves off the device and compares
// later (a disk backup's pieces, replicas' sampled bytes). Not cryptographic: it catches bytes
// that differ by accident, a disk that returns other bytes than it was given or replicas that
// do not hold the same tensors.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tagmem {

std::uint64_t checksum64(const void* data, std::size_t n) noexcept;

}  // namespace tagmem
