// thread_routing.hpp — the calling thread's routing mode (TAGMEM_PRELOAD_ROUTE_*, see
// include/tagmem/tagmem_preload.h) and the routing decision that honours it.
#pragma once

namespace tagmem::preload {

int thread_routing() noexcept;

// The tag a new runtime allocation of this thread goes to, or null for the runtime itself.
const char* routing_tag();

}  // namespace tagmem::preload
