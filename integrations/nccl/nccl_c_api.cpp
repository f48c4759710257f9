// nccl_c_api.cpp — the C ABI of tagmem_nccl.h over collective.cpp.
//
// The boundary of tagmem's own C ABI (c_boundary): exceptions become a status and a message for
// tagmem_last_error(), nothing aborts. NCCL's memory is not in a tagmem arena, but it is the tag
// TAGMEM_NCCL_TAG to tagmem's own calls: registered here, when the library is loaded.
#include "api/runtime.hpp"
#include "api/sized_struct.hpp"
#include "collective.hpp"
#include "step_log.hpp"
#include "tagmem/tagmem_nccl.h"

namespace {

const tagmem::external_tag kNcclTag = {
    TAGMEM_NCCL_TAG,
    "tagmem_nccl_pause / tagmem_nccl_resume (NCCL's memory moves collectively, in every rank)",
    tagmem::nccl::holds_memory_on,
    tagmem::nccl::tag_stats,
    tagmem::nccl::keeps_runtime,
};

[[maybe_unused]] const bool kRegistered = [] {
  tagmem::register_external_tag(&kNcclTag);
  return true;
}();

// The first released tagmem_nccl_stats ended before this field (Note [sized structs]).
constexpr std::size_t kFirstNcclStats = offsetof(tagmem_nccl_stats, backup_store_used_bytes);

}  // namespace

extern "C" {

tagmem_status tagmem_nccl_pause(const char* group, int rank, int size, int timeout_ms) {
  return tagmem::c_boundary([&] {
    tagmem::nccl::logged_step(tagmem::nccl::step::pause, group, rank, [&] {
      tagmem::nccl::pause(tagmem::nccl::resolve_spec(group, rank, size, timeout_ms));
    });
  });
}

tagmem_status tagmem_nccl_resume(const char* group, int rank, int size, int timeout_ms) {
  return tagmem::c_boundary([&] {
    tagmem::nccl::logged_step(tagmem::nccl::step::resume, group, rank, [&] {
      tagmem::nccl::resume(tagmem::nccl::resolve_spec(group, rank, size, timeout_ms));
    });
  });
}

tagmem_status tagmem_nccl_stats_get_sized(tagmem_nccl_stats* out, size_t out_size) {
  return tagmem::c_boundary([&] {
    tagmem::write_sized(tagmem::nccl::stats(), out, out_size, kFirstNcclStats, "tagmem_nccl_stats");
  });
}

// Looked up by callers of an earlier tagmem_nccl.h (where it was a function, now a macro): the
// first released struct, a prefix of every later one. The parentheses keep the macro out.
TAGMEM_API tagmem_status(tagmem_nccl_stats_get)(tagmem_nccl_stats* out);
tagmem_status(tagmem_nccl_stats_get)(tagmem_nccl_stats* out) {
  return tagmem_nccl_stats_get_sized(out, kFirstNcclStats);
}

}  // extern "C"
