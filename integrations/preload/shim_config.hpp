// shim_config.hpp — the environment variables the preload shim reads once, at start-up.
//
//  TAGMEM_PRELOAD_TAG            route every cudaMalloc/cudaMallocAsync of the process to this
//                                tag (default: only calls made inside a tag scope go to tagmem)
//  TMS_INIT_ENABLE               1 or true, with TAGMEM_PRELOAD_TAG unset: as TAGMEM_PRELOAD_TAG=
//                                default (torch_memory_saver's variable, set by its callers)
//  TAGMEM_PRELOAD_DRIVER_CALLERS comma-separated pieces of library paths whose driver entry
//                                points are wrapped and recorded in the `nccl` tag (default
//                                "libnccl"; "*" for every library). Others get the driver's own
//                                functions, so PyTorch's own cudaMalloc never lands in `nccl`.
//  TAGMEM_PRELOAD_LOG            1: one line on stderr per wrapped lookup and routing decision
#pragma once

#include <string>
#include <vector>

namespace tagmem::preload {

struct shim_config {
  std::string default_tag;  // empty: none
  std::vector<std::string> driver_callers;
  bool all_callers = false;
  bool log = false;
};

const shim_config& config();  // read on first use (the constructor makes that early)

// Whether driver lookups made by code at `caller` get the recording wrappers (cached per
// library).
bool records_driver_calls_of(const void* caller);

}  // namespace tagmem::preload
