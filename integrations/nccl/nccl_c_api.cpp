// nccl_c_api.cpp — the C ABI of tagmem_nccl.h over collective.cpp.
//
// Same boundary as tagmem's own C ABI: exceptions become a status and a message for
// tagmem_last_error(), nothing aborts. NCCL's memory is not in a tagmem arena, but it is the tag
// TAGMEM_NCCL_TAG to tagmem's own calls: registered here, when the library is loaded.
#include <new>

#include "collective.hpp"
#include "runtime.hpp"
#include "tagmem/tagmem_nccl.h"

namespace {

template <class F>
tagmem_status nccl_guarded(F&& body) noexcept {
  if (tagmem_status s = tagmem::refuse_c_call_if_forked()) return s;  // Note [fork]
  try {
    body();
    return TAGMEM_SUCCESS;
  } catch (const tagmem::error& e) {
    return tagmem::record_c_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return tagmem::record_c_error(TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                                  "out of host memory for the shim's records");
  } catch (const std::exception& e) {
    return tagmem::record_c_error(TAGMEM_ERROR_INTERNAL,
                                  std::string("internal error: ") + e.what());
  } catch (...) {
    return tagmem::record_c_error(TAGMEM_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

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
  return nccl_guarded(
      [&] { tagmem::nccl::pause(tagmem::nccl::resolve_spec(group, rank, size, timeout_ms)); });
}

tagmem_status tagmem_nccl_resume(const char* group, int rank, int size, int timeout_ms) {
  return nccl_guarded(
      [&] { tagmem::nccl::resume(tagmem::nccl::resolve_spec(group, rank, size, timeout_ms)); });
}

tagmem_status tagmem_nccl_stats_get(tagmem_nccl_stats* out) {
  return nccl_guarded([&] {
    TAGMEM_EXPECTS(out != nullptr, TAGMEM_ERROR_INVALID_ARGUMENT, "out is NULL");
    *out = tagmem::nccl::stats();
  });
}

}  // extern "C"
