// share_copy.cpp — see share_copy.hpp.
#include "replica/share_copy.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "replica/shared_buffer.hpp"
#include "transfer/copy_queue.hpp"

namespace tagmem {

std::size_t copy_share(device& dev, tag& t, shared_buffer& copy, int k, std::uint32_t generation,
                       std::size_t piece_bytes) {
  const auto [lo, hi] = copy.share(k);
  copy_to_host(dev, t, lo, hi, copy.data() + lo, piece_bytes);
  copy.mark_written(k, generation);
  return hi - lo;
}

std::size_t run_bytes(tag& t) noexcept {
  std::size_t n = 0;
  for (const auto& [va, m] : t.arena().mappings()) n += m.size;
  return n;
}

void for_each_part(tag& t, std::size_t begin, std::size_t end, std::size_t piece_bytes,
                   const std::function<void(CUdeviceptr, std::size_t, std::size_t)>& each) {
  std::size_t at = 0;  // run offset of the current mapping
  for (const auto& [va, m] : t.arena().mappings()) {
    const std::size_t lo = std::max(begin, at), hi = std::min(end, at + m.size);
    for (std::size_t p = lo; p < hi; p += piece_bytes) {
      each(va + (p - at), p, std::min(piece_bytes, hi - p));
    }
    at += m.size;
    if (at >= end) break;
  }
}

void copy_to_host(device& dev, tag& t, std::size_t begin, std::size_t end, char* host,
                  std::size_t piece_bytes) {
  context_guard guard(dev.context());
  copy_queue q(dev);
  try {
    for_each_part(t, begin, end, piece_bytes, [&](CUdeviceptr va, std::size_t at, std::size_t n) {
      q.to_host({va, host + (at - begin), n}, t.name());
    });
  } catch (...) {
    try {
      q.finish();  // nothing queued may run on after the caller gives the memory up
    } catch (...) {
    }
    throw;
  }
  q.finish();
}

void copy_to_device(device& dev, tag& t, std::size_t begin, std::size_t end, const char* host,
                    std::size_t piece_bytes) {
  context_guard guard(dev.context());
  copy_queue q(dev);
  try {
    for_each_part(t, begin, end, piece_bytes, [&](CUdeviceptr va, std::size_t at, std::size_t n) {
      q.to_device({va, const_cast<char*>(host) + (at - begin), n}, t.name());
    });
  } catch (...) {
    try {
      q.finish();
    } catch (...) {
    }
    throw;
  }
  q.finish();
}

}  // namespace tagmem
