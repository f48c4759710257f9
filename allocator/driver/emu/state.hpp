// state.hpp — the emulator's one lock, its devices and its live-object counters.
//
// Note [emu locking]: one mutex guards every table of the emulator (devices, contexts, handles,
// the address space, streams, events, host ranges, pools). Entry points take it for the short
// bookkeeping they do and never hold it while copying bytes or waiting for a stream; functions
// that expect it held take the `lock&` as their first parameter. Stream queues have their own
// mutex, always taken after (never before) the global one. Tables live in leaked singletons so
// that stream worker threads still running at process exit never touch destroyed objects.
//
// Devices are configured once, on first use, from TAGMEM_EMU_DEVICE_COUNT (default 2),
// TAGMEM_EMU_DEVICE_BYTES (default 8 GiB) and TAGMEM_EMU_CONTEXT_BYTES (default 0: what an
// active primary context takes from its device, as the real driver's does — about 500 MiB on an
// H200); sizes in plain bytes or with a K/M/G/T suffix, binary units.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace tagmem::emu {

inline constexpr size_t granularity = size_t{2} << 20;  // cuMem granularity, as on an H200
inline constexpr int max_devices = 64;                  // device masks are 64-bit

using lock = std::unique_lock<std::mutex>;
lock take_lock();

inline constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
inline constexpr bool aligned(uint64_t n, size_t to) { return n % to == 0; }

bool initialized();
void mark_initialized();

int device_count();
bool valid_device(int device);
uint64_t context_bytes();
uint64_t device_total(lock&, int device);
uint64_t device_used(lock&, int device);
// Counts `bytes` as used on `device`; false (and nothing counted) if they do not fit.
bool charge(lock&, int device, uint64_t bytes);
void uncharge(lock&, int device, uint64_t bytes);
void set_device_total(lock&, int device, uint64_t bytes);
// Physical memory `key` (its memfd's inode) of `bytes` on `device`, created here or `imported`:
// counted once for every process that shares the device (TAGMEM_EMU_SHARED_DEVICES,
// shared_ledger.hpp); without that setting an import is not counted, since its exporter counts it.
// False (nothing counted) when created memory does not fit.
bool charge_physical(lock&, int device, uint64_t key, uint64_t bytes, bool imported);
void uncharge_physical(lock&, int device, uint64_t key, uint64_t bytes, bool imported);

// Objects alive now, for leak checks (tagmem_emu_live_*). Guarded by the global lock.
struct live_objects {
  uint64_t allocations = 0;         // physical allocations whose memory still exists
  uint64_t mappings = 0;            // cuMemMap ranges not yet unmapped
  uint64_t reservations = 0;        // cuMemAddressReserve ranges not yet freed
  uint64_t device_allocations = 0;  // cuMemAlloc / cuMemAllocAsync blocks not yet freed
  uint64_t streams = 0;
  uint64_t events = 0;
  uint64_t host_allocations = 0;    // cuMemHostAlloc
  uint64_t host_registrations = 0;  // cuMemHostRegister
  uint64_t pinned_bytes = 0;        // bytes of both
};
live_objects& live(lock&);

}  // namespace tagmem::emu
