// collective.hpp — pausing and resuming the `nccl` tag across the processes of a node.
//
// See tagmem_nccl.h for the contract and collective.cpp for the steps. Both functions hold the
// record table's mutex from start to end, so NCCL threads that call a wrapped entry point in
// the meantime wait for them.
#pragma once

#include "group.hpp"
#include "tagmem/tagmem_nccl.h"

namespace tagmem::nccl {

void pause(const group_spec& spec);   // throws tagmem::error
void resume(const group_spec& spec);  // throws tagmem::error
tagmem_nccl_stats stats();

}  // namespace tagmem::nccl
