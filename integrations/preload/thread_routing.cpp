// thread_routing.cpp — per-thread override of where runtime allocations go (tagmem_preload.h).
//
// torch_memory_saver's callers switch "region tracking" on and off per thread (a region around
// weights, off around a library that shares its buffers between processes); this is that switch
// for the shim. routing_tag() in runtime_hooks.cpp consults it first.
#include "thread_routing.hpp"

#include "tagmem/tagmem_preload.h"

namespace tagmem::preload {
namespace {

thread_local int t_mode = TAGMEM_PRELOAD_ROUTE_AUTO;

}  // namespace

int thread_routing() noexcept { return t_mode; }

}  // namespace tagmem::preload

extern "C" __attribute__((visibility("default"))) int tagmem_preload_set_thread_routing(int mode) {
  using namespace tagmem::preload;
  if (mode != TAGMEM_PRELOAD_ROUTE_AUTO && mode != TAGMEM_PRELOAD_ROUTE_OFF &&
      mode != TAGMEM_PRELOAD_ROUTE_ON) {
    return -2;
  }
  const int previous = t_mode;
  t_mode = mode;
  return previous;
}

extern "C" __attribute__((visibility("default"))) int tagmem_preload_thread_routed(void) {
  return tagmem::preload::routing_tag() != nullptr ? 1 : 0;
}
