/* tagmem_nccl.h — collective release of NCCL's device memory, with the LD_PRELOAD shim loaded.
 *
 * libtagmem_preload.so wraps the CUDA driver entry points NCCL obtains through cuGetProcAddress
 * and records every device-located allocation NCCL makes, imports or maps (the `nccl` tag). The
 * functions here exist only in that library (find them with dlsym(RTLD_DEFAULT, ...) or
 * ctypes.CDLL(None)); see docs/nccl.md for how to start a job under the shim.
 *
 * NCCL shares buffers between the processes of a node: one process creates a buffer and
 * exports it as a POSIX file descriptor, its peers import and map it. A peer's mapping keeps the
 * memory alive, so releasing it is collective: every process of the node's group calls
 * tagmem_nccl_pause() (and later tagmem_nccl_resume()) with the same group name and size and
 * its own rank in [0, size). Pause waits for all device work, copies the bytes of the buffers
 * each process created to pinned host memory, then unmaps and releases NCCL's buffers in every
 * process. Resume recreates them at the same addresses, restores their bytes, hands new
 * shareable handles to the peers that had mapped them, and the peers map them again at their
 * own same addresses. No NCCL pointer or handle changes.
 *
 * Contract for the caller: no NCCL operation may run or be queued between pause and resume
 * (synchronise the streams NCCL uses before pausing; torch.cuda.synchronize() is enough).
 *
 * A group is one job. Its processes name the job the same way — TAGMEM_NCCL_JOB, else torchrun's
 * TORCHELASTIC_RUN_ID (unless "none"), else Slurm's SLURM_JOB_ID[.SLURM_STEP_ID]; with none of
 * them a call fails with INVALID_ARGUMENT naming TAGMEM_NCCL_JOB — and only processes that give
 * the same job and group meet: two jobs that use the same group name never see each other. Each
 * rank is known by its process (the pid the kernel reports for its connection, with the
 * process's start time). A process keeps, for each buffer it imported, the process it came from,
 * and for each buffer it exported, the processes found to hold it; an owner serves a claim or
 * hands a new handle only to a process it exported that buffer to, and an importer takes one only
 * from the process it imported from. Anything else fails the call on every rank with
 * TAGMEM_ERROR_PEER and a message naming both processes, before anything is released or mapped.
 *
 * The processes meet through a Unix socket in a directory private to the user: TAGMEM_NCCL_DIR,
 * else $XDG_RUNTIME_DIR/tagmem, else a per-job directory the shim picks when it loads in the
 * job's first process ($TMPDIR or /tmp, then tagmem-<uid>-<random>) and passes to the ranks as
 * TAGMEM_NCCL_DIR (so start the launcher itself under LD_PRELOAD). It is created with mode 0700
 * and refused if another user owns it, others may enter it or it is a symbolic link. Rank 0
 * holds a lock on the group's lock file while it listens; the kernel drops it when rank 0 dies,
 * so a restarted rank 0 (torchrun keeps the run id) removes the socket its predecessor left and
 * takes over. Every wait is bounded by `timeout_ms`: a missing or dead process gives
 * TAGMEM_ERROR_TIMEOUT or TAGMEM_ERROR_PEER, processes that disagree (one pauses while another
 * resumes, different sizes, a rank taken twice, another job) TAGMEM_ERROR_PEER, each with a
 * message naming the ranks involved. Waits for the device (its work before a pause, the
 * copies to and from host memory) are bounded by `timeout_ms` too: a device that does not finish
 * in time (a kernel waiting for a dead peer) gives TIMEOUT, and host or device memory that its
 * late work still uses is given back only once that work ends; the next call waits for it first.
 * A failed pause leaves every process as it was, a failed unmap included (every process maps
 * its buffers back), with stats.paused 0; only if mapping back fails as well are the buffers
 * concerned left released with their bytes, stats.paused is 1 in every process, and a resume
 * restores them. A failed resume leaves every process paused with its bytes kept (out of
 * device memory included) and can be repeated.
 */
#ifndef TAGMEM_TAGMEM_NCCL_H
#define TAGMEM_TAGMEM_NCCL_H

#include "tagmem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TAGMEM_NCCL_TAG "nccl" /* the name NCCL's memory is reported under */

typedef struct tagmem_nccl_stats {
  /* Now. Device-located allocations NCCL holds through the shim, whether mapped or released. */
  size_t held_bytes;
  size_t resident_bytes; /* of held_bytes, mapped now */
  size_t released_bytes; /* of held_bytes, given back by a pause and not yet resumed */
  size_t backup_bytes;   /* pinned host bytes holding released bytes */
  uint64_t allocations;  /* records behind held_bytes */
  /* held_bytes by origin: created here and never exported / created here and exported as a
   * POSIX fd / imported from another process (that process's memory, mapped here). */
  size_t local_bytes, exported_bytes, imported_bytes;
  uint64_t local_allocations, exported_allocations, imported_allocations;
  size_t classic_bytes;      /* of held_bytes, served by the shim to cuMemAlloc */
  size_t host_located_bytes; /* host-located cuMem bytes created, ever (passed through) */
  size_t passthrough_bytes;  /* cuMemAlloc bytes held now that went to the driver untouched */
  /* The most recent pause. */
  size_t last_released_bytes; /* by all origins */
  size_t last_released_local_bytes, last_released_exported_bytes, last_released_imported_bytes;
  uint64_t last_released_allocations;
  size_t last_kept_bytes; /* device bytes that pause had to leave mapped (see docs/nccl.md) */
  uint64_t last_kept_allocations;
  /* Ever. */
  uint64_t pause_count;
  uint64_t resume_count;
  int paused; /* 1 between a successful pause and a successful resume */
  /* Bytes of tagmem's pinned host store (the one of tagmem_device_stats) that NCCL's backups
   * hold: backup_bytes, plus backups of a pause that timed out while copies into them were still
   * running, given back when those end. */
  size_t backup_store_used_bytes;
} tagmem_nccl_stats;

/* Releases the `nccl` tag collectively across the `size` processes of group `group` of this
 * job; this process is `rank`. `group` (1-64 of [A-Za-z0-9._-]) may be NULL for
 * TAGMEM_NCCL_GROUP, else "nccl"; rank/size may be -1 for LOCAL_RANK/LOCAL_WORLD_SIZE;
 * timeout_ms may be 0 for TAGMEM_NCCL_TIMEOUT_MS (default 60000), and bounds every wait. Calls
 * of one process are serialised; call it from one thread per process.
 * Errors: INVALID_ARGUMENT (bad group name, rank or size; no job identity), TAG_OFFLOADED
 * (already paused), HOST_OUT_OF_MEMORY, DRIVER, PEER (a process that failed, disagreed, left, or
 * is not the one a buffer was shared with), TIMEOUT. */
TAGMEM_API tagmem_status tagmem_nccl_pause(const char* group, int rank, int size, int timeout_ms);

/* Undoes tagmem_nccl_pause collectively (same arguments). Errors: INVALID_ARGUMENT,
 * TAG_RESIDENT (not paused), OUT_OF_MEMORY (then every process stays paused), DRIVER, PEER,
 * TIMEOUT. */
TAGMEM_API tagmem_status tagmem_nccl_resume(const char* group, int rank, int size, int timeout_ms);

/* This process's statistics of the `nccl` tag, written to the `out_size` bytes at `out` (the
 * struct grows as tagmem.h's do: docs/abi.md). Through dlsym, look this name up and pass
 * sizeof(tagmem_nccl_stats); the macro tagmem_nccl_stats_get(out) does it for a linked caller.
 * Errors: INVALID_ARGUMENT (null out, not a tagmem_nccl_stats's size). */
TAGMEM_API tagmem_status tagmem_nccl_stats_get_sized(tagmem_nccl_stats* out, size_t out_size);
#define tagmem_nccl_stats_get(out) tagmem_nccl_stats_get_sized((out), sizeof(*(out)))

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_TAGMEM_NCCL_H */
