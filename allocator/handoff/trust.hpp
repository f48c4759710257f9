// trust.hpp — whether the process at the other end of a handoff connection may take, or give,
// device memory: one pure function, checked before any descriptor moves.
//
// Handed memory carries the giver's bytes until overwritten (the driver does not scrub it), so it
// goes only to a process of the same user, the same job and the same GPU, identified by the
// kernel (SO_PEERCRED) and by its start time, never by what it says alone.
#pragma once

#include <sys/types.h>

#include <string>

#include "handoff/handoff_messages.hpp"
#include "peers/unix_channel.hpp"

namespace tagmem::handoff {

// What this process is.
struct local_view {
  std::string job;
  gpu_uuid uuid{};
  std::uint64_t granularity = 0;
  uid_t uid = 0;
};

// "" when the peer that the kernel reports as `cred`, whose live identity is `live`
// (identity_of(cred.pid)), and that claims `c`, is of this user, job and GPU and is who it says;
// else the reason, naming both sides.
std::string mismatch(const local_view& me, const peers::peer_credentials& cred,
                     const peers::process_identity& live, const claim& c);

}  // namespace tagmem::handoff
