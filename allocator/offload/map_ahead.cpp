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

std::size_t map_ahead(device& dev, tag& t, physical_source& from) {
  if (!t.offloaded() || t.mode() != TAGMEM_DISCARD || t.partial() || from.bytes() == 0) return 0;
  context_guard guard(dev.context());
  trace::span span("map_ahead", t.name());
  physical_recycler& recycler = dev.recycler();
  std::size_t done = 0;
  for (const auto& [va, m] : t.arena().mappings()) {
    if (from.bytes() == 0) break;
    if (m.resident || m.size == 0 || recycler.parked(va)) continue;
    // Held handles must cover some of the record, and what they leave is created only with
    // room for it.
    const std::size_t most_created = std::min(m.size - 1, creatable());
    meta_vector<physical_part> parts = map_parts(dev, va, m.size, /*recycle=*/false, &from, nullptr,
                                                 /*access=*/true, most_created);
    if (parts.empty()) continue;  // left alone
    if (!recycler.park(va, m.size, parts, /*ahead=*/true)) {
      unmap_parts(dev, va, m.size, parts, false);  // no record for it: back to the driver
      continue;
    }
    done += m.size;
  }
  return done;
}

}  // namespace tagmem
