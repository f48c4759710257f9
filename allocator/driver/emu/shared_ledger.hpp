// shared_ledger.hpp — device memory counted across processes (TAGMEM_EMU_SHARED_DEVICES).
//
// The real driver counts a GPU's memory for every process together: memory one process creates
// and another imports is counted once, until the last process lets go of it, and a process that
// dies gives back everything it held. Processes of the emulator naming the same file share that
// count: the file holds each device's size and one record per piece of device memory in use,
// keyed by its memfd's inode (a physical allocation, the same in every process that imported
// it) or, for the rest a process uses (its contexts, cuMemAlloc), one record per process and
// device; each record lists the processes that hold it (pid and start time). Records of dead
// processes are dropped whenever the count is read or charged. Every operation holds an flock on
// the file, taken under the emulator's lock. Without the setting each process counts alone.
#pragma once

#include <cstdint>

namespace tagmem::emu::ledger {

// Whether TAGMEM_EMU_SHARED_DEVICES names a usable file (opened, and sized for `devices` device
// totals of `bytes` each when this process creates it).
bool enabled(int devices, uint64_t bytes);

// Physical memory `key` (a memfd inode) of `size` bytes on `device`: counted for this process;
// when nothing holds it yet, only if it fits (`check_fit`). False: it does not fit.
bool hold(int device, uint64_t key, uint64_t size, bool check_fit);
// This process lets go of `key`; the bytes are free once no live process holds it.
void drop(uint64_t key);
// The rest of this process's use of `device`, changed by `delta`; false when growth does not fit.
bool adjust_own(int device, int64_t delta);

uint64_t used(int device);
uint64_t total(int device);
void set_total(int device, uint64_t bytes);

}  // namespace tagmem::emu::ledger
