// external_tag.hpp — memory that an integration holds outside tagmem's arenas, shown as a tag.
//
// The NCCL integration of the preload shim records NCCL's own cuMem allocations and moves them
// with a collective pause and resume; they never enter a tag's arena. To users it is the tag
// "nccl" all the same: tagmem_list_tags lists it, tagmem_tag_stats_get and
// tagmem_device_stats_get count it, and tagmem_offload, tagmem_reload and tagmem_swap refuse it
// with a message naming the calls that do move it. The integration registers one such tag at
// load time; the core asks it through these functions and knows nothing else about it.
#pragma once

#include <string>

#include "tagmem/tagmem.h"

namespace tagmem {

struct external_tag {
  const char* name;            // never a tag of the registry while registered
  const char* moved_by;        // the calls that move it, for the refusal: "tagmem_nccl_pause / ..."
  bool (*listed)(int device);  // it holds memory on `device` (may throw)
  tagmem_tag_stats (*stats)(int device);  // its counts on `device` (may throw)
  // Why the runtime must not be destroyed now (its bytes are in the host store), or "".
  std::string (*keeps_runtime)();
};

// Registers `t` (one at a time; nullptr unregisters). Thread-safe.
void register_external_tag(const external_tag* t) noexcept;
// The registered tag when `name` is its name, else nullptr. Thread-safe.
const external_tag* find_external_tag(const char* name) noexcept;
// The registered tag, or nullptr.
const external_tag* registered_external_tag() noexcept;

// Throws INVALID_ARGUMENT, naming t.moved_by, for an operation on `t` that only those calls do.
[[noreturn]] void refuse_external(const external_tag& t, const char* operation);

}  // namespace tagmem
