// byte_math.hpp — rounding sizes to a granularity (driver granules, huge pages, alignments).
#pragma once

#include <cstddef>

namespace tagmem {

// `v` rounded up to a multiple of `to` (> 0).
constexpr std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

}  // namespace tagmem
