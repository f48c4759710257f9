// replica_layout.cpp — see replica_layout.hpp (Note [replica check]).
#include "replica/replica_layout.hpp"

#include <algorithm>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "peers/wire.hpp"
#include "replica/share_copy.hpp"

namespace tagmem {
namespace {

std::string mib(std::uint64_t bytes) {
  return bytes % (1u << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                 : std::to_string(bytes) + " bytes";
}

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::string replica_layout::describe() const {
  return std::to_string(allocations) + " allocations (" + mib(allocated_bytes) + ") in " +
         std::to_string(runs.size()) + " runs of mappings (" + mib(bytes) + ")";
}

replica_layout layout_of(tag& t, std::uint64_t seed) {
  replica_layout l;
  l.seed = seed;
  CUdeviceptr next = 0;
  for (const auto& [va, m] : t.arena().mappings()) {
    if (l.runs.empty() || va != next) l.runs.push_back(0);
    l.runs.back() += m.size;
    l.bytes += m.size;
    next = va + m.size;
  }
  const pool_totals& p = t.pool().totals();
  l.allocations = p.live_allocations;
  l.allocated_bytes = p.allocated_bytes;
  return l;
}

std::string encode_layout(const replica_layout& l) {
  peers::wire_writer w;
  w.u64(l.bytes).u64(l.allocations).u64(l.allocated_bytes).u64(l.seed).u64(l.spare);
  w.u32(l.generation);
  w.u32(static_cast<std::uint32_t>(l.runs.size()));
  for (std::uint64_t r : l.runs) w.u64(r);
  return w.take();
}

replica_layout decode_layout(const std::string& payload) {
  peers::wire_reader r(payload);
  replica_layout l;
  l.bytes = r.u64();
  l.allocations = r.u64();
  l.allocated_bytes = r.u64();
  l.seed = r.u64();
  l.spare = r.u64();
  l.generation = r.u32();
  l.runs.resize(r.count(sizeof(std::uint64_t)));
  for (std::uint64_t& x : l.runs) x = r.u64();
  r.finish();
  return l;
}

std::uint64_t layout_hash(const replica_layout& l) {
  replica_layout compared = l;
  compared.seed = compared.spare = 0;
  compared.generation = 0;
  const std::string text = encode_layout(compared);
  return checksum64(text.data(), text.size());
}

std::uint64_t sampled_checksum(device& dev, tag& t, std::uint64_t seed) {
  const std::size_t bytes = run_bytes(t);
  if (bytes == 0) return 0;
  const std::size_t window = std::min(kSampleBytes, bytes);
  std::vector<char> host(window * kSamples);
  std::uint64_t x = seed;
  context_guard guard(dev.context());
  for (int i = 0; i < kSamples; ++i) {
    const std::size_t at = bytes == window ? 0 : splitmix(x) % (bytes - window + 1);
    char* into = host.data() + i * window;
    for_each_part(t, at, at + window, window, [&](CUdeviceptr va, std::size_t from, std::size_t n) {
      TAGMEM_CU(cuMemcpyDtoH, into + (from - at), va, n);  // a few KiB, to pageable memory
    });
  }
  return checksum64(host.data(), host.size());
}

}  // namespace tagmem
