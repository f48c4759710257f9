/* tagmem.h — the C ABI of tagmem, a CUDA virtual-memory caching allocator with tagged pools.
 *
 * Every allocation belongs to a tag ("weights", "kv_cache", ...) on one device. A tag can be
 * offloaded — its physical device memory unmapped and released, its bytes copied to pinned host
 * memory (TAGMEM_BACKUP) or dropped (TAGMEM_DISCARD) — and reloaded at the same virtual
 * addresses, so every pointer into it stays valid across the cycle.
 *
 * Conventions for every function below:
 *  - The return value is a tagmem_status. On failure tagmem_last_error() returns a message for
 *    the calling thread naming what failed; nothing is aborted and no state is half-changed
 *    unless the function says so.
 *  - `device` is a CUDA device ordinal, or TAGMEM_CURRENT_DEVICE for the device of the calling
 *    thread's current CUDA context (device 0 when the thread has none).
 *  - Tag names are non-empty, NUL-terminated, at most TAGMEM_MAX_TAG_NAME bytes; a tag exists on
 *    a device from its first allocation (or first push) on.
 *  - All functions are thread-safe unless stated otherwise. The library initialises itself on
 *    first use with defaults and TAGMEM_* environment variables; tagmem_init() is only needed
 *    to pass a configuration.
 */
#ifndef TAGMEM_TAGMEM_H
#define TAGMEM_TAGMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TAGMEM_API __attribute__((visibility("default")))

#define TAGMEM_CURRENT_DEVICE (-1)
#define TAGMEM_MAX_TAG_NAME 63
#define TAGMEM_DEFAULT_TAG "default" /* used when the thread's tag scope is empty */

/* Same type as cudaStream_t and CUstream; NULL is the legacy default stream. */
typedef struct CUstream_st* tagmem_stream;

typedef enum tagmem_status {
  TAGMEM_SUCCESS = 0,
  TAGMEM_ERROR_INVALID_ARGUMENT = 1,   /* null pointer, zero or absurd size, bad name, bad mode */
  TAGMEM_ERROR_UNKNOWN_TAG = 2,        /* no such tag on that device */
  TAGMEM_ERROR_TAG_OFFLOADED = 3,      /* the operation needs a resident tag */
  TAGMEM_ERROR_TAG_RESIDENT = 4,       /* reload of a tag that is resident */
  TAGMEM_ERROR_UNKNOWN_POINTER = 5,    /* not allocated by tagmem, or already freed */
  TAGMEM_ERROR_OUT_OF_MEMORY = 6,      /* device memory exhausted */
  TAGMEM_ERROR_HOST_OUT_OF_MEMORY = 7, /* host (pinned) memory exhausted */
  TAGMEM_ERROR_DRIVER = 8,             /* a CUDA driver call failed; the message names it */
  TAGMEM_ERROR_NO_DRIVER = 9,          /* libcuda (or TAGMEM_LIBCUDA) could not be loaded */
  TAGMEM_ERROR_SCOPE_EMPTY = 10,       /* tagmem_pop_tag() with nothing pushed */
  TAGMEM_ERROR_PEER = 11,              /* a cooperating process failed, disagreed or vanished */
  TAGMEM_ERROR_TIMEOUT = 12,           /* a bounded wait ran out */
  TAGMEM_ERROR_INTERNAL = 13           /* an invariant broke; please report */
} tagmem_status;

typedef enum tagmem_offload_mode {
  TAGMEM_BACKUP = 0, /* copy the bytes to pinned host memory; reload restores them */
  TAGMEM_DISCARD = 1 /* drop the bytes; reload maps fresh memory with undefined contents */
} tagmem_offload_mode;

typedef enum tagmem_tag_state {
  TAGMEM_RESIDENT = 0,
  TAGMEM_OFFLOADED_BACKUP = 1,
  TAGMEM_OFFLOADED_DISCARD = 2
} tagmem_tag_state;

/* Configuration for tagmem_init(). Fill with tagmem_config_init() first; a zero field keeps the
 * default (or the TAGMEM_* environment variable named beside it). */
typedef struct tagmem_config {
  size_t struct_size;       /* sizeof(tagmem_config), set by tagmem_config_init() */
  size_t chunk_bytes;       /* TAGMEM_CHUNK_BYTES: physical chunk for small segments (2 MiB) */
  size_t arena_bytes;       /* TAGMEM_ARENA_BYTES: virtual range reserved per tag (256 GiB) */
  size_t copy_piece_bytes;  /* TAGMEM_COPY_PIECE_BYTES: size of one offload/reload copy (64 MiB) */
  size_t max_mapping_bytes; /* TAGMEM_MAX_MAPPING_BYTES: largest physical allocation a reload
                               coalesces a contiguous range into (1 GiB) */
} tagmem_config;

typedef struct tagmem_tag_stats {
  tagmem_tag_state state;
  size_t allocated_bytes;    /* bytes in live allocations (after rounding to the alignment) */
  size_t requested_bytes;    /* bytes the caller asked for in live allocations */
  size_t reserved_bytes;     /* bytes in segments: live, cached and free blocks */
  size_t mapped_bytes;       /* physical device memory mapped for this tag now */
  size_t host_bytes;         /* pinned host bytes holding this tag's backup now */
  size_t virtual_bytes;      /* virtual address space reserved for this tag */
  uint64_t live_allocations; /* allocations not yet freed */
  uint64_t mappings;         /* physical allocations mapped (or backed up) for this tag */
  uint64_t alloc_count;      /* successful allocations, ever */
  uint64_t free_count;       /* successful frees, ever */
  uint64_t offload_count;    /* completed offloads, ever */
  uint64_t reload_count;     /* completed reloads, ever */
  uint64_t bytes_offloaded;  /* bytes copied device -> host by offloads, ever */
  uint64_t bytes_reloaded;   /* bytes copied host -> device by reloads, ever */
} tagmem_tag_stats;

typedef struct tagmem_device_stats {
  size_t allocated_bytes;        /* sum over the device's tags */
  size_t reserved_bytes;         /* sum over the device's tags */
  size_t mapped_bytes;           /* sum over the device's tags */
  size_t device_free_bytes;      /* free device memory as the driver reports it */
  size_t device_total_bytes;     /* total device memory as the driver reports it */
  size_t host_pinned_bytes;      /* the process-wide pinned host store, held now */
  size_t host_pinned_high_water; /* its largest size so far */
  size_t host_used_bytes;        /* of the store, bytes holding backups now (all devices) */
  uint64_t tags;                 /* tags that exist on the device */
  size_t release_pending_bytes;  /* offloaded with DISCARD, not yet back with the driver */
} tagmem_device_stats;

/* ---- lifetime and errors ------------------------------------------------------------------- */

/* Fills `config` with defaults (zeros) and its struct_size. Never fails on a non-null pointer. */
TAGMEM_API void tagmem_config_init(tagmem_config* config);

/* Initialises tagmem with `config` (NULL: defaults and environment). Loads the CUDA driver from
 * TAGMEM_LIBCUDA if set, else libcuda.so.1; it never falls back to anything else.
 * Errors: NO_DRIVER, DRIVER, INVALID_ARGUMENT (bad config). Calling it again while initialised
 * is INVALID_ARGUMENT. */
TAGMEM_API tagmem_status tagmem_init(const tagmem_config* config);

/* Releases every tag on every device (live allocations included: their pointers become
 * invalid), the host store and the driver. tagmem may be initialised again afterwards.
 * Must not race with other tagmem calls. */
TAGMEM_API tagmem_status tagmem_shutdown(void);

/* The message of the calling thread's most recent failure ("" if none). Valid until the thread's
 * next tagmem call. */
TAGMEM_API const char* tagmem_last_error(void);

/* A constant name for a status ("TAGMEM_ERROR_UNKNOWN_TAG"); "TAGMEM_UNKNOWN_STATUS" otherwise. */
TAGMEM_API const char* tagmem_status_string(tagmem_status status);

/* ---- tag scope (per thread) ---------------------------------------------------------------- */

/* Makes `tag` the calling thread's current tag until the matching pop. Scopes nest.
 * Errors: INVALID_ARGUMENT (bad name). */
TAGMEM_API tagmem_status tagmem_push_tag(const char* tag);

/* Ends the innermost scope. Errors: SCOPE_EMPTY. */
TAGMEM_API tagmem_status tagmem_pop_tag(void);

/* The calling thread's current tag (TAGMEM_DEFAULT_TAG when no scope is open). The pointer stays
 * valid until the scope is popped. */
TAGMEM_API const char* tagmem_current_tag(void);

/* ---- allocation ---------------------------------------------------------------------------- */

/* Allocates `size` bytes in the current tag on `device`, for use on `stream`; *ptr is aligned to
 * at least 256 bytes. Memory freed earlier on `stream` is reused at once; memory freed on another
 * stream is reused only after `stream` is made to wait for that stream's work.
 * Errors: INVALID_ARGUMENT (null ptr, size 0 or larger than the device), TAG_OFFLOADED,
 * OUT_OF_MEMORY, DRIVER. On failure *ptr is NULL. */
TAGMEM_API tagmem_status tagmem_malloc(void** ptr, size_t size, int device, tagmem_stream stream);

/* As tagmem_malloc, in the named tag. */
TAGMEM_API tagmem_status tagmem_malloc_tagged(void** ptr, size_t size, const char* tag, int device,
                                              tagmem_stream stream);

/* Frees an allocation made by tagmem. The memory may be reused by `stream` at once and by other
 * streams once the work queued on `stream` before this call has finished. Freeing in an offloaded
 * tag is allowed (bookkeeping only). Errors: UNKNOWN_POINTER (never allocated, already freed, or
 * not the start of an allocation). */
TAGMEM_API tagmem_status tagmem_free(void* ptr, tagmem_stream stream);

/* Reports which tag and device own `ptr` (any address inside a live allocation) and the
 * allocation's start and size. Any out-pointer may be NULL. `tag` receives at most `tag_len`
 * bytes including the NUL. Errors: UNKNOWN_POINTER. */
TAGMEM_API tagmem_status tagmem_pointer_info(const void* ptr, char* tag, size_t tag_len,
                                             int* device, void** base, size_t* size);

/* ---- offload and reload -------------------------------------------------------------------- */

/* Offloads the listed tags of `device`: waits for all work queued on the device, copies each
 * tag's mapped bytes to the pinned host store (BACKUP) or not (DISCARD), then unmaps and releases
 * the physical memory. Virtual addresses stay reserved; touching them faults until reload.
 * DISCARD leaves the release itself to a background thread (the driver scrubs what it gets
 * back, ~0.5 ms per GiB): the memory reaches the driver shortly after the call returns. tagmem's
 * own allocations and reloads wait for it when they need it; before another process or
 * allocator takes the memory, call tagmem_wait_released(). TAGMEM_DISCARD_RELEASE=wait makes
 * DISCARD release before returning.
 * The list is checked first (unknown tag, already offloaded, duplicates): on such an error no tag
 * is changed. A failure while copying leaves every tag resident with its bytes intact.
 * Errors: INVALID_ARGUMENT, UNKNOWN_TAG, TAG_OFFLOADED, HOST_OUT_OF_MEMORY, DRIVER. */
TAGMEM_API tagmem_status tagmem_offload(const char* const* tags, size_t count, int device,
                                        tagmem_offload_mode mode);

/* Reloads the listed offloaded tags at their old addresses, restoring every byte of BACKUP tags.
 * A tag whose reload fails (OUT_OF_MEMORY included) stays offloaded with its backup intact, so
 * the caller can free device memory and call again. Tags before it in the list stay reloaded.
 * Errors: INVALID_ARGUMENT, UNKNOWN_TAG, TAG_RESIDENT, OUT_OF_MEMORY, DRIVER. */
TAGMEM_API tagmem_status tagmem_reload(const char* const* tags, size_t count, int device);

/* A phase switch: offloads `out_tags` (in `mode`) and reloads `in_tags` on `device`, overlapping
 * the two directions where possible. Checks both lists before acting. If the reload part fails,
 * the offload part has still happened and the status says why the reload failed.
 * As with DISCARD offloads, the out-tags' physical memory is released by a background thread,
 * once the swap's copies are done: call tagmem_wait_released() before another process or
 * allocator takes it. TAGMEM_SWAP_RELEASE=inline releases it before returning (slower).
 * Errors: those of tagmem_offload and tagmem_reload. */
TAGMEM_API tagmem_status tagmem_swap(const char* const* out_tags, size_t out_count,
                                     const char* const* in_tags, size_t in_count, int device,
                                     tagmem_offload_mode mode);

/* Returns to the driver the physical memory of resident tags' segments that hold no live
 * allocation (all tags of `device`), and waits for pending releases as tagmem_wait_released
 * does. Offloaded tags are left alone. */
TAGMEM_API tagmem_status tagmem_empty_cache(int device);

/* Waits until the physical memory of `device` that DISCARD offloads and swaps gave up is back
 * with the driver (see tagmem_offload), so that other allocators and processes can have it. Returns
 * at once when nothing is pending. Errors: DRIVER if a release failed (it is tried again by the
 * next call; the memory stays counted in release_pending_bytes). Thread-safe. */
TAGMEM_API tagmem_status tagmem_wait_released(int device);

/* ---- pinned host store ----------------------------------------------------------------------- */

/* Grows the pinned host store to at least `bytes` ahead of need. With `wait` 0 the pinning runs
 * on background threads and the call returns at once; a later offload waits for it as needed.
 * Errors: HOST_OUT_OF_MEMORY, DRIVER (only when wait != 0). */
TAGMEM_API tagmem_status tagmem_host_reserve(size_t bytes, int wait);

/* Unpins and frees host store memory that holds no backup, keeping at least `keep_bytes`.
 * Errors: DRIVER if a slab cannot be unpinned; that slab stays pinned and usable, the others
 * are freed. */
TAGMEM_API tagmem_status tagmem_host_trim(size_t keep_bytes);

/* ---- statistics ---------------------------------------------------------------------------- */

/* Statistics of one tag. Errors: INVALID_ARGUMENT (null out), UNKNOWN_TAG. */
TAGMEM_API tagmem_status tagmem_tag_stats_get(const char* tag, int device, tagmem_tag_stats* out);

/* Statistics of one device. Errors: INVALID_ARGUMENT, DRIVER. */
TAGMEM_API tagmem_status tagmem_device_stats_get(int device, tagmem_device_stats* out);

/* Writes up to `capacity` tag names of `device` into `names` (each TAGMEM_MAX_TAG_NAME + 1 bytes,
 * NUL-terminated) and the number of tags into *count (which may exceed capacity). */
TAGMEM_API tagmem_status tagmem_list_tags(int device, char (*names)[TAGMEM_MAX_TAG_NAME + 1],
                                          size_t capacity, size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_TAGMEM_H */
