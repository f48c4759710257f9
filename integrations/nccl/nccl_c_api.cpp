// nccl_c_api.cpp — the C ABI of tagmem_nccl.h over collective.cpp.
//
// The boundary of tagmem's own C ABI (c_boundary): exceptions become a status and a message for
// tagmem_last_error(), nothing aborts. NCCL's memory is not in a tagmem arena, but it is the tag
// TAGMEM_NCCL_TAG to tagmem's own calls: registered here, when the library is loaded.
#include "collective.hpp"
#include "api/runtime.hpp"
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

tagmem_status tagmem_nccl_stats_get(tagmem_nccl_stats* out) {
  return tagmem::c_boundary([&] {
    TAGMEM_EXPECTS(out != nullptr, TAGMEM_ERROR_INVALID_ARGUMENT, "out is NULL");
    *out = tagmem::nccl::stats();
  });
}

}  // extern "C"
