// byte_math.hpp — rounding sizes to a granularity (driver granules, huge pages, alignments).
//
// A size that comes from a caller (an allocation, a reserve, a setting) is rounded with
// round_up_checked: near SIZE_MAX the plain sum wraps, and a request for everything would turn
// into a request for nothing that then "succeeds".
#pragma once

#include <cstddef>
#include <string>

#include "base/error.hpp"

namespace tagmem {

// No mapping a process gets from mmap or cuMemAddressReserve without a placement hint lies above
// 2^48 on the platforms CUDA runs on, so no single size beyond it can ever be satisfied.
inline constexpr std::size_t kMaxAddressableBytes = std::size_t{1} << 48;

// `v` rounded up to a multiple of `to` (> 0). Only for sizes known to be far below SIZE_MAX.
constexpr std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

// `v` rounded up to a multiple of `to` (> 0) into `out`; false when that does not fit a size_t.
constexpr bool round_up_fits(std::size_t v, std::size_t to, std::size_t& out) {
  std::size_t sum = 0;
  if (__builtin_add_overflow(v, to - 1, &sum)) return false;
  out = sum / to * to;
  return true;
}

// `v` rounded up to a multiple of `to` (> 0); throws `code` naming `what` when the result would
// exceed kMaxAddressableBytes (or wrap).
inline std::size_t round_up_checked(std::size_t v, std::size_t to, tagmem_status code,
                                    const char* what) {
  std::size_t out = 0;
  if (!round_up_fits(v, to, out) || out > kMaxAddressableBytes) {
    fail(code, std::string(what) + " of " + std::to_string(v) +
                   " bytes is larger than any address space (2^48 bytes)");
  }
  return out;
}

}  // namespace tagmem
