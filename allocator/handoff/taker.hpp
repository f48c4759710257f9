// taker.hpp — the taking side of one connection: greeting a giver, then importing what it gives.
//
// A giver's HELLO is checked (trust.hpp) before anything else: a process of another user, job or
// GPU, or one that is not who it claims, gets REFUSE and the connection closes. Then, per GIVE,
// the taker imports the handles it wants (a prefix: it stops at the first it does not want or
// cannot import), keeps them in the inbox and answers TAKEN with how many and how much more it
// wants; descriptors it does not take are closed (owned_fds). A taker never sends descriptors.
// Every wait is bounded by TAGMEM_HANDOFF_TIMEOUT_MS; a session that fails or times out ends,
// and what was imported stays this process's.
#pragma once

#include <atomic>
#include <cstdint>

#include "handoff/counters.hpp"
#include "handoff/identity.hpp"
#include "handoff/inbox.hpp"
#include "handoff/want_book.hpp"
#include "peers/unix_channel.hpp"

namespace tagmem {
class device;
}

namespace tagmem::handoff {

// Serves `ch` until DONE, a failure or silence; `greet`: expects a HELLO first. `coming` holds
// the bytes still to come in this session as far as the taker knows (what the giver offers and
// this process wants, less what arrived), 0 once it ends.
void serve_giver(device& dev, const identity& id, want_book& book, inbox& held, counters& stats,
                 peers::unix_channel& ch, bool greet, std::atomic<std::uint64_t>& coming) noexcept;

}  // namespace tagmem::handoff
