// map_ahead.cpp — Note [mapped ahead] in map_ahead.hpp.
#include "offload/map_ahead.hpp"

#include <algorithm>

#include "device/device.hpp"
#include "device/physical_flow.hpp"
#include "device/physical_recycler.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "observe/trace.hpp"
#include "tags/tag.hpp"

namespace tagmem {

namespace {

constexpr std::size_t kSlack = std::size_t{1} << 30;  // left free for others (the Note)

// What may be created now: the device's free memory less the slack.
std::size_t creatable() noexcept {
  std::size_t free = 0, total = 0;
  if (driver::api().cuMemGetInfo(&free, &total) != CUDA_SUCCESS) return 0;
  return free > kSlack ? free - kSlack : 0;
}

}  // namespace

ahead_result map_ahead(device& dev, tag& t, physical_source& from, std::size_t coming) {
  ahead_result out;
  if (!t.offloaded() || t.mode() != TAGMEM_DISCARD || t.partial() || from.bytes() == 0) return out;
  context_guard guard(dev.context());
  trace::span span("map_ahead", t.name());
  physical_recycler& recycler = dev.recycler();
  auto wanting = [&](CUdeviceptr va, const mapping& m) {
    return !m.resident && m.size != 0 && !recycler.parked(va);
  };
  std::size_t left = 0;  // bytes of the records still to map
  for (const auto& [va, m] : t.arena().mappings()) left += wanting(va, m) ? m.size : 0;
  for (const auto& [va, m] : t.arena().mappings()) {
    const std::size_t held = from.bytes();
    if (held == 0) break;
    if (!wanting(va, m)) continue;
    // This record's share of what is held and coming (the Note).
    const auto share = static_cast<std::size_t>(std::min<unsigned __int128>(
        m.size, ((unsigned __int128)m.size * (held + coming) + left - 1) / left));
    if (coming != 0 && held < share) {
      out.waiting = true;
      break;
    }
    left -= m.size;
    // Held handles must cover some of the record, and what they leave is created only with
    // room for it. A record whose share no held handle fits takes what fits in all of it.
    map_limits limits{share, std::min(m.size - 1, creatable())};
    meta_vector<physical_part> parts =
        map_parts(dev, va, m.size, /*recycle=*/false, &from, nullptr, /*access=*/true, limits);
    if (parts.empty() && share < m.size) {
      limits.most_received = m.size;
      parts = map_parts(dev, va, m.size, false, &from, nullptr, true, limits);
    }
    if (parts.empty()) continue;  // left alone
    if (!recycler.park(va, m.size, parts, /*ahead=*/true)) {
      unmap_parts(dev, va, m.size, parts, false);  // no record for it: back to the driver
      continue;
    }
    out.mapped += m.size;
  }
  return out;
}

}  // namespace tagmem
