/* entry_points.h — PyTorch pluggable-allocator entry points over tagmem (libtagmem_torch_alloc.so).
 *
 * PyTorch's CUDAPluggableAllocator takes an allocation function `void* (size_t size, int device,
 * cudaStream_t stream)` and a free function `void (void* ptr, size_t size, int device,
 * cudaStream_t stream)`, looked up by name in a shared library. This library offers two kinds:
 *
 *  - Slots (MemPool mode). tagmem_torch_alloc_<k> for k in [0, TAGMEM_TORCH_SLOTS) allocates in
 *    the tag bound to slot k with tagmem_torch_bind_slot(). The alloc callback carries no pool
 *    identity and may run on any thread (autograd's device threads included), so the tag is part
 *    of the function itself, never of the calling thread: see Note [torch allocator slots] in
 *    entry_points.cpp. A failure returns NULL (PyTorch's caching allocator then frees cached
 *    blocks, retries, and raises torch.OutOfMemoryError).
 *  - tagmem_torch_alloc (global mode): allocates in the calling thread's tag scope
 *    (tagmem_push_tag). PyTorch does not check its result, so a failure throws a C++
 *    std::runtime_error carrying tagmem's message, which PyTorch turns into a Python RuntimeError.
 *
 * tagmem_torch_free frees for both. Nothing here takes the Python GIL or needs libtorch; every
 * function is thread-safe. The library links libtagmem.so, so it uses whichever tagmem instance
 * the process already has (the preload shim's, or the one the Python package loaded).
 */
#ifndef TAGMEM_TORCH_ENTRY_POINTS_H
#define TAGMEM_TORCH_ENTRY_POINTS_H

#include <stddef.h>
#include <stdint.h>

#include "tagmem/tagmem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TAGMEM_TORCH_API __attribute__((visibility("default")))
#define TAGMEM_TORCH_SLOTS 64

/* Binds slot `slot` to `tag` for the life of the process. Binding a slot again to the same tag
 * succeeds; to another tag it fails (PyTorch may still hold segments through the slot).
 * A first binding checks the name with tagmem_push_tag/tagmem_pop_tag, which creates the tag on
 * the calling thread's current device. Returns TAGMEM_SUCCESS, TAGMEM_ERROR_INVALID_ARGUMENT
 * (slot out of range, bad tag name, slot bound to another tag) or another failure of
 * tagmem_push_tag (tagmem could not initialise); tagmem_torch_bind_error() then says why. */
TAGMEM_TORCH_API tagmem_status tagmem_torch_bind_slot(int slot, const char* tag);

/* Why the calling thread's last failed tagmem_torch_bind_slot() failed. Valid until its next
 * call on this thread. */
TAGMEM_TORCH_API const char* tagmem_torch_bind_error(void);

/* The tag bound to `slot`, or NULL when the slot is unbound or out of range. */
TAGMEM_TORCH_API const char* tagmem_torch_slot_tag(int slot);

/* TAGMEM_TORCH_SLOTS. */
TAGMEM_TORCH_API int tagmem_torch_slot_count(void);

/* Global mode: allocates `size` bytes in the calling thread's current tag. Size 0 gives NULL.
 * Throws std::runtime_error on failure (see above). */
TAGMEM_TORCH_API void* tagmem_torch_alloc(size_t size, int device, tagmem_stream stream);

/* Frees what either kind of entry point allocated. Never throws: a failure is counted, recorded
 * for tagmem_torch_last_failure() and reported on stderr. NULL is ignored. */
TAGMEM_TORCH_API void tagmem_torch_free(void* ptr, size_t size, int device, tagmem_stream stream);

/* How many allocations and frees through these entry points failed so far (process-wide). */
TAGMEM_TORCH_API uint64_t tagmem_torch_failures(void);

/* Copies the message of the most recent failure (any thread) into `buffer` (at most `length`
 * bytes with the NUL) and returns the message's full length; "" when nothing failed yet. */
TAGMEM_TORCH_API size_t tagmem_torch_last_failure(char* buffer, size_t length);

/* Slot entry points: tagmem_torch_alloc_0 ... tagmem_torch_alloc_63, each
 *   void* tagmem_torch_alloc_<k>(size_t size, int device, tagmem_stream stream);
 * They are looked up by name (CUDAPluggableAllocator, dlsym); no declarations are needed. */

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_TORCH_ENTRY_POINTS_H */
