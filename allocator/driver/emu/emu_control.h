/* emu_control.h — the control API of the emulated CUDA driver (libtagmem_emu.so).
 *
 * The emulated driver implements the CUDA driver entry points tagmem uses over host memory (see the
 * "driver seam" section of docs/design.md). Tests and the demo load it through TAGMEM_LIBCUDA and
 * use these functions, linked directly or found with dlsym, to shape and inspect it: device sizes,
 * bytes in use, live objects for leak checks, call counts and injected faults.
 *
 * Every function is thread-safe and may be called before cuInit. `device` is a device ordinal
 * in [0, tagmem_emu_device_count()). Nothing here exists in the real driver.
 */
#ifndef TAGMEM_EMU_CONTROL_H
#define TAGMEM_EMU_CONTROL_H

#include <cuda.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TAGMEM_EMU_API __attribute__((visibility("default")))

/* ---- devices ------------------------------------------------------------------------------ */

/* Number of emulated devices (TAGMEM_EMU_DEVICE_COUNT, default 2, fixed at first use). */
TAGMEM_EMU_API int tagmem_emu_device_count(void);

/* Sets a device's memory size. Memory already in use stays; while more is in use than the new
 * size, cuMemGetInfo reports 0 free and allocations fail with CUDA_ERROR_OUT_OF_MEMORY.
 * Returns 0, or -1 for an invalid device. */
TAGMEM_EMU_API int tagmem_emu_set_device_bytes(int device, uint64_t bytes);

/* A device's memory size (TAGMEM_EMU_DEVICE_BYTES, default 8 GiB); 0 for an invalid device. */
TAGMEM_EMU_API uint64_t tagmem_emu_device_bytes(int device);

/* Bytes counted as used on a device: physical allocations from cuMemCreate until released and
 * unmapped everywhere, cuMemAlloc/cuMemAllocAsync blocks (pool caches included) until given
 * back, and TAGMEM_EMU_CONTEXT_BYTES (default 0) while its primary context is retained — the
 * real driver's contexts take device memory too. 0 for an invalid device. */
TAGMEM_EMU_API uint64_t tagmem_emu_device_used_bytes(int device);

/* ---- live objects (leak checks) ----------------------------------------------------------- */

/* Bytes of host memory pinned by cuMemHostAlloc and cuMemHostRegister, not yet given back. */
TAGMEM_EMU_API uint64_t tagmem_emu_pinned_host_bytes(void);
/* Physical allocations (cuMemCreate, cuMemImportFromShareableHandle) whose memory still exists:
 * a handle is unreleased or a mapping remains. */
TAGMEM_EMU_API uint64_t tagmem_emu_live_allocations(void);
/* cuMemMap mappings not yet unmapped. */
TAGMEM_EMU_API uint64_t tagmem_emu_live_mappings(void);
/* cuMemAddressReserve reservations not yet freed. */
TAGMEM_EMU_API uint64_t tagmem_emu_live_reservations(void);
/* cuMemAlloc / cuMemAllocAsync blocks handed out and not yet freed. */
TAGMEM_EMU_API uint64_t tagmem_emu_live_device_allocations(void);
/* Streams and events created and not yet destroyed. */
TAGMEM_EMU_API uint64_t tagmem_emu_live_streams(void);
TAGMEM_EMU_API uint64_t tagmem_emu_live_events(void);
/* cuMemHostAlloc blocks and cuMemHostRegister ranges not yet given back. */
TAGMEM_EMU_API uint64_t tagmem_emu_live_host_allocations(void);
TAGMEM_EMU_API uint64_t tagmem_emu_live_host_registrations(void);

/* ---- calls and fault injection ------------------------------------------------------------ */

/* Makes the nth call from now (1-based) of entry point `entry` — its base name as in
 * entry_points.def, e.g. "cuMemCreate" — return `error` without any side effect; with a null
 * `entry`, the nth call of any entry point. Several faults may be armed at once; each fires
 * once. Returns 0, or -1 for an unknown name, nth == 0 or error == CUDA_SUCCESS. */
TAGMEM_EMU_API int tagmem_emu_fail_call(const char* entry, uint64_t nth, CUresult error);

/* Disarms every fault not yet fired. */
TAGMEM_EMU_API void tagmem_emu_clear_faults(void);

/* Calls made so far to `entry` (all entry points with a null `entry`), injected failures
 * included; 0 for an unknown name. */
TAGMEM_EMU_API uint64_t tagmem_emu_call_count(const char* entry);

/* ---- asynchrony and errors ---------------------------------------------------------------- */

/* Limits the speed of every copy and memset executed on a stream or inline (0: unlimited, the
 * default). Slow copies make ordering bugs such as unmapping memory that a copy still reads show
 * up every time rather than by chance. */
TAGMEM_EMU_API void tagmem_emu_set_copy_bytes_per_second(uint64_t bytes_per_second);

/* Stalls a stream, as a copy engine can stall one (Note [a stalled stream] in
 * allocator/transfer/copy_queue.hpp): the next asynchronous host-to-device copy queued on a
 * created stream does not start until tagmem_emu_release_held_copy(); the stream's later work
 * waits behind it, other streams run on. */
TAGMEM_EMU_API void tagmem_emu_hold_next_h2d_copy(void);
TAGMEM_EMU_API void tagmem_emu_release_held_copy(void);

/* Holds the next cuMemMap of any thread of this process (a reload in the middle of its runs)
 * until tagmem_emu_release_held_map(); the call then maps as usual. */
TAGMEM_EMU_API void tagmem_emu_hold_next_map(void);
TAGMEM_EMU_API void tagmem_emu_release_held_map(void);
/* Holds the next cuMemRelease of any thread of this process (a release thread in the middle of
 * its queue) until tagmem_emu_release_held_release(); the call then releases as usual. */
TAGMEM_EMU_API void tagmem_emu_hold_next_release(void);
TAGMEM_EMU_API void tagmem_emu_release_held_release(void);

/* The sticky error of a device's primary context (CUDA_SUCCESS when healthy): set when an
 * asynchronous operation faults, returned from then on by every call that uses the context,
 * cleared when the primary context's last reference is released. */
TAGMEM_EMU_API CUresult tagmem_emu_sticky_error(int device);

/* Clears a device's sticky error without tearing down its context (tests only: the real driver
 * offers no way back). Returns 0, or -1 for an invalid device. */
TAGMEM_EMU_API int tagmem_emu_clear_sticky_error(int device);

#ifdef __cplusplus
}
#endif

#endif /* TAGMEM_EMU_CONTROL_H */
