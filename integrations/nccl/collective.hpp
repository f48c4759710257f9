// collective.hpp — pausing and resuming the `nccl` tag across the processes of a node.
//
// See tagmem_nccl.h for the contract and collective.cpp for the steps. Both functions hold the
// record table's mutex from start to end, so NCCL threads that call a wrapped entry point in
// the meantime wait for them.
#pragma once

#include <string>

#include "peers/group.hpp"
#include "tagmem/tagmem_nccl.h"

namespace tagmem::nccl {

using peers::group_spec;
using peers::resolve_spec;

void pause(const group_spec& spec);   // throws tagmem::error
void resume(const group_spec& spec);  // throws tagmem::error
tagmem_nccl_stats stats();

// The `nccl` tag as tagmem's own calls see it (external_tag.hpp): whether NCCL holds memory on
// `device`, its counts there, and why tagmem_shutdown must wait ("" when it need not).
bool holds_memory_on(int device);
tagmem_tag_stats tag_stats(int device);
std::string keeps_runtime();

}  // namespace tagmem::nccl
