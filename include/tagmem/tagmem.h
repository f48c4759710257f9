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
 *    a device from its first allocation there on, or from the first tagmem_push_tag of its name
 *    by a thread whose current device it is (tags are never removed before tagmem_shutdown).
 *  - Under the LD_PRELOAD shim, NCCL's memory is the tag "nccl" (docs/nccl.md): listed and
 *    counted like any tag on the devices where NCCL holds memory, but moved only by
 *    tagmem_nccl_pause / tagmem_nccl_resume; offloading, reloading, swapping or allocating in it
 *    fails with INVALID_ARGUMENT.
 *  - All functions are thread-safe unless stated otherwise. The library initialises itself on
 *    first use with defaults and TAGMEM_* environment variables; tagmem_init() is only needed
 *    to pass a configuration.
 *  - fork(): once tagmem has started in a process (begun loading the CUDA driver; a shutdown does
 *    not undo it), a child made by fork() cannot use it: tagmem's threads and CUDA do not survive
 *    fork(). In such a child every function that returns a tagmem_status (tagmem_nccl.h's
 *    included) fails at once with TAGMEM_ERROR_FORKED and a message saying so, touching no lock,
 *    thread or driver state, and never blocks; the parent is unaffected. Use tagmem in the parent,
 *    or start children with exec (Python multiprocessing: 'spawn' or 'forkserver'). A process
 *    forked before tagmem started uses it normally.
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
  TAGMEM_ERROR_INTERNAL = 13,          /* an invariant broke; please report */
  TAGMEM_ERROR_FORKED = 14,            /* called in a child forked after tagmem started */
  TAGMEM_ERROR_IO = 15                 /* a disk backup file could not be made, written or read
                                          back whole and unchanged; the message names the file */
} tagmem_status;

typedef enum tagmem_offload_mode {
  TAGMEM_BACKUP = 0,     /* copy the bytes to pinned host memory; reload restores them */
  TAGMEM_DISCARD = 1,    /* drop the bytes; reload maps fresh memory with undefined contents */
  TAGMEM_BACKUP_DISK = 2 /* write the bytes to files in the disk directory (TAGMEM_DISK_DIR,
                            tagmem_set_disk_dir), not to host memory; reload reads them back,
                            checks them and removes the files (docs/disk.md) */
} tagmem_offload_mode;

typedef enum tagmem_tag_state {
  TAGMEM_RESIDENT = 0,
  TAGMEM_OFFLOADED_BACKUP = 1,
  TAGMEM_OFFLOADED_DISCARD = 2,
  TAGMEM_OFFLOADED_DISK = 3
} tagmem_tag_state;

/* Structs that cross this ABI grow only at their end, and the library reads and writes no byte
 * past the size the caller's copy of this header gave them (docs/abi.md): tagmem_config says it
 * in struct_size, which tagmem_config_init() and TAGMEM_CONFIG_INIT set to the caller's sizeof;
 * the statistics calls are macros that pass sizeof(*out) to their _sized function. A size below
 * the struct's first released size, or above 4096, is INVALID_ARGUMENT. A caller built against a
 * newer header than the library gets 0 in the fields the library does not know, and a non-zero
 * field of tagmem_config the library does not know is INVALID_ARGUMENT. Callers that bind the
 * library without this header (ctypes, dlsym) call the _sized functions with their struct's size.
 */

/* Configuration for tagmem_init(). Fill with tagmem_config_init() or TAGMEM_CONFIG_INIT first;
 * a zero field keeps the default (or the TAGMEM_* environment variable named beside it). */
typedef struct tagmem_config {
  size_t struct_size;       /* the caller's sizeof(tagmem_config), set by tagmem_config_init() */
  size_t chunk_bytes;       /* TAGMEM_CHUNK_BYTES: physical chunk for small segments (2 MiB) */
  size_t arena_bytes;       /* TAGMEM_ARENA_BYTES: virtual range reserved per tag (256 GiB) */
  size_t copy_piece_bytes;  /* TAGMEM_COPY_PIECE_BYTES: size of one offload/reload copy (64 MiB) */
  size_t max_mapping_bytes; /* TAGMEM_MAX_MAPPING_BYTES: largest physical allocation a reload
                               coalesces a contiguous range into (1 GiB) */
  size_t host_max_bytes;    /* TAGMEM_HOST_MAX_BYTES: the most host memory the pinned host store
                               may hold (unset: no cap beyond the default budget, see
                               tagmem_host_reserve) */
} tagmem_config;

typedef struct tagmem_tag_stats {
  tagmem_tag_state state;
  size_t allocated_bytes;      /* bytes in live allocations (after rounding to the alignment) */
  size_t requested_bytes;      /* bytes the caller asked for in live allocations */
  size_t reserved_bytes;       /* bytes in segments: live, cached and free blocks */
  size_t mapped_bytes;         /* physical device memory mapped for this tag now (parked
                                  memory of an offloaded tag is parked_bytes, not this) */
  size_t host_bytes;           /* pinned host bytes holding this tag's backup now */
  size_t virtual_bytes;        /* virtual address space reserved for this tag */
  uint64_t live_allocations;   /* allocations not yet freed */
  uint64_t mappings;           /* physical allocations mapped (or backed up) for this tag */
  uint64_t alloc_count;        /* successful allocations, ever */
  uint64_t free_count;         /* successful frees, ever */
  uint64_t offload_count;      /* completed offloads, ever */
  uint64_t reload_count;       /* completed reloads, ever */
  uint64_t bytes_offloaded;    /* bytes copied device -> host by offloads, ever */
  uint64_t bytes_reloaded;     /* bytes copied host -> device by reloads, ever */
  size_t peak_allocated_bytes; /* the most allocated_bytes has been since the tag was created */
  size_t peak_mapped_bytes;    /* the most mapped_bytes has been since the tag was created */
  size_t parked_bytes;         /* of an offloaded tag: physical device memory still mapped at its
                                  addresses, not counted in mapped_bytes (a DISCARD offload with
                                  TAGMEM_RECYCLE_PHYSICAL=keep parks its mappings until a reload
                                  takes them back or tagmem needs the memory elsewhere; with
                                  handoff, memory handed over while a DISCARD tag is offloaded is
                                  mapped into it ahead of its reload: TAGMEM_HANDOFF_MAP_AHEAD) */
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
  size_t release_pending_bytes;  /* offloaded (DISCARD, swapped out, or kept for recycling),
                                    not yet back with the driver */
  size_t host_budget_bytes;      /* the most the pinned host store may hold now (all devices;
                                    see tagmem_host_reserve) */
} tagmem_device_stats;

/* ---- lifetime and errors ------------------------------------------------------------------- */

/* Fills the `size` bytes of `config` with defaults (zeros) and sets struct_size to `size`; does
 * nothing when `config` is NULL or `size` is not a tagmem_config's (see above). Call it through
 * tagmem_config_init(config), which passes the caller's sizeof. */
TAGMEM_API void tagmem_config_init_sized(tagmem_config* config, size_t size);
#define tagmem_config_init(config) tagmem_config_init_sized((config), sizeof(*(config)))

/* A tagmem_config with every field zero (the defaults) and the caller's struct_size. */
#define TAGMEM_CONFIG_INIT \
  { sizeof(tagmem_config), 0, 0, 0, 0, 0 }

/* Initialises tagmem with `config` (NULL: defaults and environment). Loads the CUDA driver from
 * TAGMEM_LIBCUDA if set, else libcuda.so.1; it never falls back to anything else.
 * Every setting is checked here, the TAGMEM_* variables (read once, here) as much as `config`'s
 * fields: a bad one (unparsable, zero, not a multiple of 2 MiB where the granularity needs it,
 * beyond 2^48 bytes) fails with INVALID_ARGUMENT and a message naming the setting and its value.
 * Errors: NO_DRIVER, DRIVER, INVALID_ARGUMENT (bad config). Calling it again while initialised
 * is INVALID_ARGUMENT. */
TAGMEM_API tagmem_status tagmem_init(const tagmem_config* config);

/* Describes every TAGMEM_* setting, one line each: "NAME ORIGIN VALUE", the fields separated by
 * spaces, VALUE running to the end of the line. ORIGIN is one of
 *   default                    not set; VALUE is the default as documented ("2 MiB", "unset")
 *   environment                VALUE is the variable's, as given
 *   chosen-by-tagmem           this process put VALUE in its environment itself (the rendezvous
 *                              directory, TAGMEM_NCCL_DIR, when none is given), for its children
 *   invalid                    the variable's value, which tagmem_init would refuse
 *   tagmem_config.<field>      a field of the last tagmem_init's config overrode the variable
 *   unknown                    a TAGMEM_* variable that is no setting (tagmem_init warns once)
 * Writes the text, NUL-terminated, into `buf` when it fits in `capacity` bytes, and the bytes it
 * needs (with the NUL) into *needed when `needed` is not NULL. `buf` may be NULL when `capacity`
 * is 0, to ask for the size. Reads the environment as it is now; does not initialise tagmem.
 * Errors: INVALID_ARGUMENT when the text does not fit (nothing is written) or `buf` is NULL
 * with a non-zero capacity. Thread-safe, but as getenv: not against a concurrent setenv. */
TAGMEM_API tagmem_status tagmem_config_describe(char* buf, size_t capacity, size_t* needed);

/* Releases every tag on every device (live allocations included: their pointers become
 * invalid), the host store and the driver. tagmem may be initialised again afterwards.
 * Must not race with other tagmem calls. Errors: TAG_OFFLOADED, changing nothing, while the
 * host store holds backups of NCCL's paused memory (tagmem_nccl_resume first). */
TAGMEM_API tagmem_status tagmem_shutdown(void);

/* The message of the calling thread's most recent failure ("" if none). Valid until the thread's
 * next tagmem call. */
TAGMEM_API const char* tagmem_last_error(void);

/* A constant name for a status ("TAGMEM_ERROR_UNKNOWN_TAG"); "TAGMEM_UNKNOWN_STATUS" otherwise. */
TAGMEM_API const char* tagmem_status_string(tagmem_status status);

/* ---- tag scope (per thread) ---------------------------------------------------------------- */

/* Makes `tag` the calling thread's current tag until the matching pop. Scopes nest. Creates the
 * tag on the calling thread's current device (TAGMEM_CURRENT_DEVICE) if it does not exist there,
 * so tagmem_list_tags and tagmem_tag_stats_get see it before its first allocation; like any
 * other call, initialises tagmem on first use.
 * Errors: INVALID_ARGUMENT (bad name, checked first: nothing is created), NO_DRIVER, DRIVER,
 * HOST_OUT_OF_MEMORY (initialising tagmem or the device; nothing is pushed). */
TAGMEM_API tagmem_status tagmem_push_tag(const char* tag);

/* Ends the innermost scope. Errors: SCOPE_EMPTY. */
TAGMEM_API tagmem_status tagmem_pop_tag(void);

/* The calling thread's current tag (TAGMEM_DEFAULT_TAG when no scope is open). The pointer stays
 * valid until the scope is popped. */
TAGMEM_API const char* tagmem_current_tag(void);

/* ---- allocation ---------------------------------------------------------------------------- */

/* Allocates `size` bytes in the current tag on `device`, for use on `stream`; *ptr is aligned to
 * at least 256 bytes. Memory freed earlier on `stream` is reused at once; memory freed on another
 * stream is reused only after `stream` is made to wait for that stream's work. With a NULL stream
 * (or CU_STREAM_LEGACY) the memory is usable on any stream when the call returns, as cudaMalloc's
 * is: reusing memory freed on another stream first waits on the host for the work that stream had
 * queued at the free (memory freed on the NULL stream itself is still reused at once, ordered
 * only on that stream). CU_STREAM_PER_THREAD is another stream in each thread, so memory freed on
 * it always counts as freed on another stream.
 * Errors: INVALID_ARGUMENT (null ptr, size 0 or larger than the device), TAG_OFFLOADED,
 * OUT_OF_MEMORY, DRIVER. On failure *ptr is NULL. */
TAGMEM_API tagmem_status tagmem_malloc(void** ptr, size_t size, int device, tagmem_stream stream);

/* As tagmem_malloc, in the named tag. */
TAGMEM_API tagmem_status tagmem_malloc_tagged(void** ptr, size_t size, const char* tag, int device,
                                              tagmem_stream stream);

/* Frees an allocation made by tagmem. The memory may be reused by `stream` at once and by other
 * streams once the work queued on `stream` before this call has finished; with
 * CU_STREAM_PER_THREAD (the calling thread's stream) only after that work, on any stream. Freeing
 * in an offloaded tag is allowed (bookkeeping only). Errors: UNKNOWN_POINTER (never allocated,
 * already freed, or not the start of an allocation), DRIVER (recording the point of a free on
 * CU_STREAM_PER_THREAD failed; nothing is freed). */
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
 * DISCARD leaves the release itself to a background thread (the driver scrubs what it gets back, in
 * time linear in the bytes): the memory reaches the driver shortly after the call returns. tagmem's
 * own allocations and reloads wait for it when they need it; before another process or allocator
 * takes the memory, call tagmem_wait_released(). TAGMEM_DISCARD_RELEASE=wait makes
 * DISCARD release before returning. With TAGMEM_RECYCLE_PHYSICAL=keep the process keeps the
 * memory instead, and a DISCARD offload leaves it mapped until a reload takes it back or
 * something else needs it (docs/design.md, parked mappings): until then the addresses do not
 * fault. With TAGMEM_HANDOFF=on, what the job's processes do not take (DISCARD, and BACKUP while
 * one of them copies a reload on this GPU) waits in the background, while such copies run, before
 * it goes back to the driver (docs/handoff.md). With TAGMEM_OFFLOAD_RETURN=queued the call
 * returns once every copy is queued, and the tags stay locked until their copies end
 * (docs/handoff.md). The wait for the device's work includes those copies, so offload DISCARD tags
 * before BACKUP ones when both go out: their memory is then free at once.
 * The list is checked first (unknown tag, already offloaded, duplicates): on such an error no tag
 * is changed. A failure while copying leaves every tag resident with its bytes intact, and so
 * does HOST_OUT_OF_MEMORY when the backups do not fit in the host budget (tagmem_host_reserve).
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

/* Waits until the physical memory of `device` that DISCARD offloads and swaps gave up (and what
 * was kept for recycling, see tagmem_release_physical) is back with the driver (see
 * tagmem_offload), so that other allocators and processes can have it. Returns at once when
 * nothing is pending. With TAGMEM_HANDOFF=on it first waits while a process of the job copies a
 * reload on this GPU, at most TAGMEM_HANDOFF_TIMEOUT_MS (a release beside those copies would slow
 * them). Errors: DRIVER if a release failed (it is tried again by the next call; the memory stays
 * counted in release_pending_bytes). Thread-safe. */
TAGMEM_API tagmem_status tagmem_wait_released(int device);

/* Says how `tag` of `device` will be offloaded (creating the tag if needed; callable at any time,
 * the latest call wins). With TAGMEM_BACKUP, while the tag grows a background thread pins host
 * memory for it in the pinned host store (TAGMEM_PIN_AHEAD=on, the default), never beyond the
 * host budget, so that its first offload copies at once instead of pinning first; with
 * TAGMEM_DISCARD nothing is pinned for it. Tags without a plan are not pinned ahead. A plan
 * repeated with the same mode changes nothing (host memory given back since, by tagmem_host_trim
 * or a freed backup, is pinned again only as the tag grows). The plan does not restrict how the
 * tag may actually be offloaded.
 * Errors: INVALID_ARGUMENT (bad name, device or mode). Thread-safe. */
TAGMEM_API tagmem_status tagmem_tag_plan_offload(const char* tag, int device,
                                                 tagmem_offload_mode mode);

/* Hands the physical memory that offloads and swaps of `device` kept for recycling
 * (TAGMEM_RECYCLE_PHYSICAL=keep: an offload keeps its memory so that a later reload or swap of
 * the same process maps it without a release and a create) to the background release, and
 * returns at once; tagmem_wait_released() does the same and waits until it is back with the
 * driver. Kept memory counts in release_pending_bytes. With the default setting (`swap`)
 * nothing is kept between calls and this returns at once.
 * Errors: INVALID_ARGUMENT (no such device). Thread-safe. */
TAGMEM_API tagmem_status tagmem_release_physical(int device);

/* ---- pinned host store ----------------------------------------------------------------------- */

/* The host budget: the pinned host store (BACKUP offloads, swaps, reserves) never grows beyond
 *   min(TAGMEM_HOST_MAX_BYTES if set, what it holds + headroom), where
 *   headroom = min(MemAvailable, in each memory cgroup of the process up to its hierarchy's root:
 *              limit - (usage - what the kernel can reclaim)) - max(64 MiB, total / 32),
 *   what the kernel can reclaim in a cgroup: its file pages (active and inactive) and reclaimable
 *              slab, less its share of the low watermark, as MemAvailable counts them,
 *   total    = min(MemTotal, the tightest cgroup limit)
 * (cgroup v2 memory.max / memory.current; cgroup v1 memory.limit_in_bytes / usage_in_bytes where
 * no v2 level has a limit). It is re-read whenever the store grows, and checked before a page is
 * touched: a growth beyond it fails with HOST_OUT_OF_MEMORY naming the budget, the bytes asked and
 * the setting, instead of the kernel killing the process. tagmem_device_stats reports it now as
 * host_budget_bytes. */

/* Grows the pinned host store to at least `bytes` ahead of need. With `wait` 0 the pinning runs
 * on background threads and the call returns at once; a later offload waits for it as needed
 * (background growth stops at the host budget without an error).
 * Errors: INVALID_ARGUMENT (`bytes` beyond 2^48, more than any process can map; checked in both
 * modes, nothing is started), HOST_OUT_OF_MEMORY (beyond the host budget, or the driver has
 * none), DRIVER (only when wait != 0). */
TAGMEM_API tagmem_status tagmem_host_reserve(size_t bytes, int wait);

/* Unpins and frees host store memory that holds no backup, keeping at least `keep_bytes`, and
 * gives back the shared host copies that resident replicated tags keep for their next offload
 * (tagmem_set_replicated).
 * Errors: DRIVER if a slab cannot be unpinned; that slab stays pinned and usable, the others
 * are freed. */
TAGMEM_API tagmem_status tagmem_host_trim(size_t keep_bytes);

/* ---- free-memory margin --------------------------------------------------------------------- */

/* Makes every later tagmem_malloc / tagmem_malloc_tagged fail with OUT_OF_MEMORY when the
 * device's free memory (as the driver reports it) minus the request would drop below `bytes`,
 * leaving room for other allocators and processes. The check runs before the cache is consulted,
 * so it may refuse a request the cache could have served. 0 (the default) turns it off.
 * Process-wide, all devices. Never fails. Thread-safe. */
TAGMEM_API void tagmem_set_memory_margin(size_t bytes);

/* The margin set by tagmem_set_memory_margin (0: none). Thread-safe. */
TAGMEM_API size_t tagmem_memory_margin(void);

/* ---- offloaded bytes on the host ------------------------------------------------------------ */

/* tagmem_host_view flags: without TAGMEM_HOST_VIEW_WRITABLE the caller promises only to read. */
#define TAGMEM_HOST_VIEW_WRITABLE 1

/* Where the bytes of an offloaded allocation wait in the pinned host store, so a checkpoint or a
 * weight broadcast reads them without a reload. `ptr` is any address inside a live allocation
 * whose tag is offloaded with TAGMEM_BACKUP. *host receives the host address of the byte at
 * `ptr`, *bytes the number of bytes from there that are contiguous in host memory, at most up to
 * the end of the allocation (its requested size). The backup of one allocation may lie in several
 * host pieces (the store hands out extents, copies are cut into TAGMEM_COPY_PIECE_BYTES pieces):
 * when *bytes is less than what remains of the allocation, call again at ptr + *bytes for the
 * next piece. With TAGMEM_HOST_VIEW_WRITABLE the caller may write through the view and the
 * reload restores what was written; otherwise writing is not allowed.
 * The view is valid until the tag is reloaded (or swapped in), the allocation is freed, or
 * tagmem_shutdown(); tagmem_host_trim() never frees store memory that holds a backup. The caller
 * must keep those from racing with its use of the view.
 * Errors: INVALID_ARGUMENT (null out-pointer, unknown flag bits), UNKNOWN_POINTER (not inside a
 * live tagmem allocation), TAG_RESIDENT (the tag is resident, or its offload stopped part way
 * and some of its bytes are still on the device; a resident tag's current kept backup, see
 * tagmem_set_keep_backup, is readable without TAGMEM_HOST_VIEW_WRITABLE), TAG_OFFLOADED (offloaded
 * with TAGMEM_DISCARD: no bytes were kept). On failure *host and *bytes are left unchanged.
 * Thread-safe. */
TAGMEM_API tagmem_status tagmem_host_view(const void* ptr, int flags, void** host, size_t* bytes);

/* Makes reloads of `tag` on `device` keep (keep != 0) or give back (0) its BACKUP host copy. A
 * kept copy stays in the pinned host store after the reload with the bytes the tag had at its
 * offload, and tagmem_host_view() reads it (never with TAGMEM_HOST_VIEW_WRITABLE: writing would
 * not reach the device) while the tag is resident, until the tag allocates or frees (then
 * TAG_RESIDENT: its allocations may have changed), is offloaded again (the new offload writes a
 * fresh copy, which may take the old one's host memory; an offload refused for want of host
 * memory, HOST_OUT_OF_MEMORY, leaves the old copy kept), or is reloaded with the flag off. A tag
 * whose last offload stopped part way keeps only the part that left the device: a view of the
 * rest is TAG_RESIDENT. Turning the flag off gives nothing back by itself. The kept copy counts
 * in the tag's host_bytes and in the host budget; tagmem_host_trim() never frees it.
 * Errors: UNKNOWN_TAG (create the tag first, for example with tagmem_push_tag), INVALID_ARGUMENT
 * (bad device). Thread-safe. */
TAGMEM_API tagmem_status tagmem_set_keep_backup(const char* tag, int device, int keep);

/* Makes reloads of `tag` on `device` give the host memory of its BACKUP copy back to the system
 * (unpin != 0) instead of keeping it pinned for the next offload (0, the default). Such a tag's
 * backups are held in pinned host memory of their own, sized to the backup and shared with no
 * other kind of tag, and a reload unpins and unmaps what it leaves unused, so the process's
 * resident memory drops after the reload; the next offload pins again (slower, as every first
 * offload is). torch_memory_saver's "mmap" CPU-backup backend maps to this. A tag that keeps its
 * backup (tagmem_set_keep_backup) keeps it pinned all the same. The flag takes effect at the next
 * offload: a backup made while it was set goes back at its reload even if it was cleared since,
 * and one made before it was set stays in the pinned memory that other tags reuse.
 * Errors: UNKNOWN_TAG (create the tag first), INVALID_ARGUMENT (bad device). Thread-safe. */
TAGMEM_API tagmem_status tagmem_set_unpin_backup(const char* tag, int device, int unpin);

/* Makes `tag` on `device` a replicated tag: the processes of this job that call this for the same
 * tag name and `group` (1-40 characters of [A-Za-z0-9._-]), each with its own `rank` of `size`
 * (at most 256), hold the same bytes in the same layout of it, and its TAGMEM_BACKUP offloads
 * keep one host copy for all of them: each replica copies only its share (1/size) of the bytes
 * into host memory the replicas share, and each reload copies the whole of it back
 * (docs/replicated.md). An offload of a replicated tag waits for its replicas (at most
 * TAGMEM_REPLICA_TIMEOUT_MS per step) and fails with INVALID_ARGUMENT, every tag untouched, when
 * they do not hold the same layout and sampled bytes; TAGMEM_DISCARD, TAGMEM_BACKUP_DISK and
 * swaps treat it as any tag. `group` NULL makes the tag plain again.
 * Errors: UNKNOWN_TAG (create the tag first), INVALID_ARGUMENT (bad device, group name, rank or
 * size; no job identity: set TAGMEM_JOB), TAG_OFFLOADED (the tag is offloaded through its
 * replicas' host copy: reload it first). Thread-safe. */
TAGMEM_API tagmem_status tagmem_set_replicated(const char* tag, int device, const char* group,
                                               int rank, int size);

/* Sets the directory TAGMEM_BACKUP_DISK writes its files to, for offloads from now on (it must
 * exist; tags already on disk keep their files). NULL or "" goes back to TAGMEM_DISK_DIR. The
 * directory should be on a real disk: on tmpfs the files live in host memory.
 * Errors: INVALID_ARGUMENT (a path that is not a directory). Thread-safe. */
TAGMEM_API tagmem_status tagmem_set_disk_dir(const char* dir);

/* Sets the largest file TAGMEM_BACKUP_DISK writes, for offloads from now on: a mapping larger
 * than this goes to several files (one file descriptor each is held while offloaded). 0 goes back
 * to TAGMEM_DISK_FILE_BYTES (1 GiB). Errors: INVALID_ARGUMENT (not a multiple of 1 MiB).
 * Thread-safe. */
TAGMEM_API tagmem_status tagmem_set_disk_file_bytes(size_t bytes);

/* ---- statistics ---------------------------------------------------------------------------- */

/* Statistics of one tag, written to the `out_size` bytes at `out`. Call it through
 * tagmem_tag_stats_get(tag, device, out), which passes sizeof(*out).
 * Errors: INVALID_ARGUMENT (null out, not a tagmem_tag_stats's size), UNKNOWN_TAG. */
TAGMEM_API tagmem_status tagmem_tag_stats_get_sized(const char* tag, int device,
                                                    tagmem_tag_stats* out, size_t out_size);
#define tagmem_tag_stats_get(tag, device, out) \
  tagmem_tag_stats_get_sized((tag), (device), (out), sizeof(*(out)))

/* Statistics of one device, written to the `out_size` bytes at `out`. Call it through
 * tagmem_device_stats_get(device, out), which passes sizeof(*out).
 * Errors: INVALID_ARGUMENT (null out, not a tagmem_device_stats's size, bad device), DRIVER. */
TAGMEM_API tagmem_status tagmem_device_stats_get_sized(int device, tagmem_device_stats* out,
                                                       size_t out_size);
#define tagmem_device_stats_get(device, out) \
  tagmem_device_stats_get_sized((device), (out), sizeof(*(out)))

/* Writes up to `capacity` tag names of `device` into `names` (each TAGMEM_MAX_TAG_NAME + 1 bytes,
 * NUL-terminated) and the number of tags into *count (which may exceed capacity). */
TAGMEM_API tagmem_status tagmem_list_tags(int device, char (*names)[TAGMEM_MAX_TAG_NAME + 1],
                                          size_t capacity, size_t* count);

/* Where tagmem's own records live since the last tagmem_init(): "mimalloc" (loaded privately at
 * run time), or "system" (malloc) when TAGMEM_METADATA=system, when libmimalloc.so.2 (or
 * TAGMEM_MIMALLOC_LIBRARY) could not be loaded, and before the first tagmem_init(). A constant
 * string. Never fails. Thread-safe. */
TAGMEM_API const char* tagmem_metadata_heap(void);

/* Writes the trace recorded so far to the file TAGMEM_TRACE names (docs/observe.md), replacing
 * it whole; it is also written at exit and at tagmem_shutdown, which ends it (a failure to write
 * it there is logged on stderr and does not fail the shutdown). Does nothing when TAGMEM_TRACE
 * was not set at the last tagmem_init. Errors: INVALID_ARGUMENT (the file cannot be written; the
 * message names it). Thread-safe; does not initialise tagmem. */
TAGMEM_API tagmem_status tagmem_trace_flush(void);

/* ---- handoff between processes of one job -------------------------------------------------- */
/* With TAGMEM_HANDOFF=on, memory an offload gives up goes to a process of the same user, job
 * (TAGMEM_JOB) and GPU that reloads or has said it will, instead of to the driver; that process
 * maps it when it reloads, without creating memory (docs/handoff.md). Without the setting these
 * calls fail with INVALID_ARGUMENT, and nothing else changes.
 * Amended contracts with it on: tagmem_offload's memory may go to a process of the job;
 * tagmem_wait_released and tagmem_release_physical also give back memory received and not mapped;
 * release_pending_bytes counts it. */
typedef struct tagmem_handoff_stats {
  uint64_t given_bytes;           /* ever: handed to processes of the job */
  uint64_t given_handles;         /* ever */
  uint64_t received_bytes;        /* ever: handed to this process */
  uint64_t received_handles;      /* ever */
  uint64_t mapped_received_bytes; /* ever: of those, mapped by reloads (no cuMemCreate) */
  uint64_t returned_bytes;        /* ever: received, then to the driver unmapped */
  size_t held_bytes;              /* now: received, not mapped */
  uint64_t refused_peers;         /* ever: refused for uid, job, GPU, identity or protocol */
  uint64_t reload_waits;          /* ever: reloads that waited (TAGMEM_HANDOFF_WAIT_MS) */
  uint64_t reload_wait_timeouts;  /* ever: of those, gave up */
  uint64_t reload_wait_ns;        /* ever: time spent waiting */
  int listening;                  /* takes memory from the job's processes now */
} tagmem_handoff_stats;

/* This process will reload about `bytes` on `device` (0: what its offloaded tags there map): the
 * job's processes hand it what they give up meanwhile, held at most TAGMEM_HANDOFF_HOLD_MS. The
 * latest call wins; a reload covers it. Errors: INVALID_ARGUMENT (handoff off, bad device), PEER
 * (cannot listen in the job's directory; TAGMEM_LOG=info says why). Thread-safe. */
TAGMEM_API tagmem_status tagmem_handoff_expect(int device, size_t bytes);
/* Stops what tagmem_handoff_expect started; memory held for it goes back to the driver. Errors:
 * INVALID_ARGUMENT (handoff off, bad device). Thread-safe. */
TAGMEM_API tagmem_status tagmem_handoff_cancel(int device);
/* The device's handoff figures, written to the `out_size` bytes at `out`. Call it through
 * tagmem_handoff_stats_get(device, out), which passes sizeof(*out). Errors: INVALID_ARGUMENT (null
 * out, not a tagmem_handoff_stats's size, handoff off, bad device). Thread-safe. */
TAGMEM_API tagmem_status tagmem_handoff_stats_get_sized(int device, tagmem_handoff_stats* out,
                                                        size_t out_size);
#define tagmem_handoff_stats_get(device, out) \
  tagmem_handoff_stats_get_sized((device), (out), sizeof(*(out)))

/* ---- tagged memory that other processes map (CUDA IPC) ------------------------------------- */
/* A process exports a range of a tagged allocation as a 64-byte handle that any channel may carry;
 * another process of the same user (and job, TAGMEM_JOB, where both have one) opens it and maps
 * the same device memory at an address of its own, readable and writable, with nothing of its
 * own in tagmem. Descriptors pass over the user's private socket directory (TAGMEM_PEER_DIR) only
 * after the exporter has identified the opening process (SO_PEERCRED, start time, job) and the
 * handle's secret matched. A tag whose memory another process has open cannot be offloaded or
 * swapped out (PEER naming that process) until it closes it; as with cudaIpcGetMemHandle, the
 * exporter keeps the allocation alive while others use it (docs/ipc.md). */
typedef struct tagmem_ipc_handle {
  unsigned char bytes[64];
} tagmem_ipc_handle;

/* Exports [ptr, ptr + bytes), which must lie inside one live tagmem allocation of a resident
 * tag. The same range exported again gives the same handle. The first export starts a thread
 * that answers the job's processes. Errors: INVALID_ARGUMENT (NULL, 0 bytes, a range past its
 * allocation, TAGMEM_IPC=off, no private directory), UNKNOWN_POINTER (not
 * tagmem's, or freed), PEER (cannot listen in the private directory). Thread-safe. */
TAGMEM_API tagmem_status tagmem_ipc_export(const void* ptr, size_t bytes,
                                           tagmem_ipc_handle* handle);
/* Forgets an export of this process: later opens are refused; ranges opened stay mapped until
 * closed. Freeing the allocation forgets its exports too. Errors: INVALID_ARGUMENT (NULL, not
 * this process's handle), UNKNOWN_POINTER (no such export). Thread-safe. */
TAGMEM_API tagmem_status tagmem_ipc_unexport(const tagmem_ipc_handle* handle);
/* Maps another process's export on the same GPU: *ptr receives the address of the range here,
 * *bytes its size and *device (optional, may be NULL) the device ordinal in this process. Each
 * open maps anew; tagmem_ipc_close(*ptr) undoes it. The exporter exiting later does not unmap it.
 * Errors: INVALID_ARGUMENT (NULL, not a tagmem handle, this process's own handle, the GPU not
 * visible here, no private directory), PEER (the exporter refused — another user or job, a wrong
 * secret, an export forgotten — or is gone; the message says which), TAG_OFFLOADED (the tag is
 * offloaded there now), TIMEOUT (no answer within TAGMEM_HANDOFF_TIMEOUT_MS), DRIVER.
 * Thread-safe. */
TAGMEM_API tagmem_status tagmem_ipc_open(const tagmem_ipc_handle* handle, void** ptr, size_t* bytes,
                                         int* device);
/* Unmaps a range tagmem_ipc_open returned and tells its exporter. Work queued on it must have
 * finished. Errors: UNKNOWN_POINTER (not an address tagmem_ipc_open returned, or closed).
 * Thread-safe. */
TAGMEM_API tagmem_status tagmem_ipc_close(void* ptr);

typedef struct tagmem_ipc_stats {
  uint64_t exports;         /* now: exports of this process */
  uint64_t importers;       /* now: opens of this process's exports by other processes */
  uint64_t opened_by_peers; /* ever: opens of this process's exports */
  uint64_t refused_peers;   /* ever: opens refused (user, job, identity, secret, gone export) */
  uint64_t open_here;       /* now: other processes' exports this process has open */
  /* now: allocations this process freed while another process still maps them, and their bytes.
   * Freed for the caller, they stay out of the pool (counted in reserved_bytes) until the last
   * process mapping them closes them. */
  uint64_t held_allocations;
  uint64_t held_bytes;
} tagmem_ipc_stats;
/* This process's IPC figures, written to the `out_size` bytes at `out`. Call it through
 * tagmem_ipc_stats_get(out), which passes sizeof(*out). Errors: INVALID_ARGUMENT (NULL out, not
 * a tagmem_ipc_stats's size). Thread-safe. */
TAGMEM_API tagmem_status tagmem_ipc_stats_get_sized(tagmem_ipc_stats* out, size_t out_size);
#define tagmem_ipc_stats_get(out) tagmem_ipc_stats_get_sized((out), sizeof(*(out)))

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_TAGMEM_H */
