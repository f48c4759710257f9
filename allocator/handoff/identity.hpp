// identity.hpp — what one device's handoff knows of itself: job, directory, GPU, bounds.
#pragma once

#include <string>

#include "handoff/trust.hpp"

namespace tagmem::handoff {

struct identity {
  std::string dir;     // the job's private directory (peers/private_dir.hpp)
  local_view me;       // job, GPU UUID, granularity, uid
  claim mine;          // the same as this process tells a peer, with its pid and start time
  int timeout_ms = 0;  // TAGMEM_HANDOFF_TIMEOUT_MS
  int hold_ms = 0;     // TAGMEM_HANDOFF_HOLD_MS
  std::size_t default_largest = 0;  // the largest useful handle while not reloading
};

// The bound on a greeting: an answer comes at once from a live taker, and a giver does not stall
// its offload on one that is busy.
inline int greeting_timeout_ms(const identity& id) {
  return id.timeout_ms < 250 ? id.timeout_ms : 250;
}

}  // namespace tagmem::handoff
