// registry_map_ahead.cpp — the thread that maps received memory into offloaded DISCARD tags
// (Note [mapped ahead] in offload/map_ahead.hpp).
#include <chrono>

#include "base/exit_flag.hpp"
#include "observe/log.hpp"
#include "offload/map_ahead.hpp"
#include "registry/registry.hpp"

namespace tagmem {

void registry::start_mapping_ahead(int ordinal, device& d, handoff::service& h) {
  // The thread stops at exit rather than map during it (early_offloads's handler, registered
  // with ahead_, joins it afterwards).
  watch_exit();
  try {
    ahead_->start(ordinal, [this, ordinal, &d, &h](const auto& queued) {
      queued();  // start() returns at once: the thread runs until stopped
      map_ahead_loop(ordinal, d, h);
    });
  } catch (const std::exception& e) {  // no thread: reloads map what they receive, as with `off`
    if (logging(log_level::info)) log_line(std::string("no thread to map ahead: ") + e.what());
  }
}

void registry::map_ahead_loop(int ordinal, device& d, handoff::service& h) noexcept {
  using clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  physical_source& held = h.held();
  const auto hold = milliseconds(cfg_.handoff_hold_ms);
  std::uint64_t seen = held.arrivals();
  // A tag that was busy (its lock held: an operation on it, or a brief look at it) is tried
  // again at the next few ticks, not forever: trying takes and puts back what is held.
  int retries = 0;
  bool waiting = false;  // a record waits for the rest of its share (map_ahead)
  while (!ahead_stop_.load() && !exiting()) {
    const auto now = clock::now();
    // TAGMEM_HANDOFF_HOLD_MS, as for the memory held unmapped.
    std::size_t changed = d.recycler().release_ahead_before(now - hold, d.releases());
    const bool arrived = h.wait_for_more(now + milliseconds(waiting ? 2 : 100), seen);
    const std::uint64_t coming = h.coming();
    if (!arrived && retries == 0 && changed == 0 && !(waiting && coming == 0)) continue;
    seen = held.arrivals();
    retries = arrived ? 3 : retries - (retries > 0);
    bool busy = false;
    waiting = false;
    if (held.bytes() != 0) {
      try {
        for (tag* t : tags(ordinal)) {
          std::unique_lock lock(t->mutex(), std::try_to_lock);
          if (!lock.owns_lock()) {
            busy = true;
            continue;
          }
          const ahead_result r = map_ahead(d, *t, held, coming);
          changed += r.mapped;
          waiting |= r.waiting;
        }
      } catch (const std::exception& e) {  // what failed is left for the reload to map
        if (logging(log_level::info)) log_line(std::string("mapping ahead: ") + e.what());
      }
    }
    if (!busy) retries = 0;
    if (changed != 0) note_offloaded(ordinal);  // what the offloaded tags still lack
  }
}

}  // namespace tagmem
