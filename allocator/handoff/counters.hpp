// counters.hpp — what a device's handoff has done, for tagmem_handoff_stats_get.
#pragma once

#include <atomic>
#include <cstdint>

namespace tagmem::handoff {

struct counters {
  std::atomic<std::uint64_t> given_bytes{0}, given_handles{0};
  std::atomic<std::uint64_t> received_bytes{0}, received_handles{0};
  std::atomic<std::uint64_t> mapped_received_bytes{0};
  std::atomic<std::uint64_t> returned_bytes{0};  // received, then to the driver unmapped
  std::atomic<std::uint64_t> refused_peers{0};
  std::atomic<std::uint64_t> reload_waits{0}, reload_wait_timeouts{0}, reload_wait_ns{0};
};

}  // namespace tagmem::handoff
