/* c_calls.h — tagmem calls the fuzzer must make from C: with an offload mode that is no
 * enumerator. C lets a caller pass any int as an enum; C++ does not (Note [enums from C] in
 * allocator/api/c_api.cpp), so only a C translation unit can make these calls without itself
 * breaking the language rules. */
#ifndef TAGMEM_FUZZ_C_CALLS_H
#define TAGMEM_FUZZ_C_CALLS_H

#include "tagmem/tagmem.h"

#ifdef __cplusplus
extern "C" {
#endif

tagmem_status fuzz_offload(const char* const* tags, size_t count, int device, int mode);
tagmem_status fuzz_swap(const char* const* out_tags, size_t out_count, const char* const* in_tags,
                        size_t in_count, int device, int mode);

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_FUZZ_C_CALLS_H */
