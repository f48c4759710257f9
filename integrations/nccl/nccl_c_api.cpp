// nccl_c_api.cpp — the C ABI of tagmem_nccl.h over collective.cpp.
//
// Same boundary as tagmem's own C ABI: exceptions become a status and a message for
// tagmem_last_error(), nothing aborts. These functions do not need tagmem's registry (NCCL's
// memory is not in a tagmem arena); they load the driver only when there is work to do.
#include "c_error.hpp"
#include "collective.hpp"
#include "error.hpp"
#include "step_log.hpp"
#include "tagmem/tagmem_nccl.h"

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
