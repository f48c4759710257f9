/* c_calls.c — see c_calls.h. */
#include "c_calls.h"

tagmem_status fuzz_offload(const char* const* tags, size_t count, int device, int mode) {
  return tagmem_offload(tags, count, device, (tagmem_offload_mode)mode);
}

tagmem_status fuzz_swap(const char* const* out_tags, size_t out_count, const char* const* in_tags,
                        size_t in_count, int device, int mode) {
  return tagmem_swap(out_tags, out_count, in_tags, in_count, device, (tagmem_offload_mode)mode);
}
