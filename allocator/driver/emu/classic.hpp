// classic.hpp — cuMemAlloc/cuMemFree and the stream-ordered allocator (cuMemAllocAsync/FreeAsync).
//
// Blocks are anonymous read-write mappings registered in the address space as device
// allocations, so copies validate against them like against cuMemMap mappings. Each device has
// one default pool: a block freed with cuMemFreeAsync goes to the pool's cache when its stream
// reaches the free (never earlier, so reuse can never race queued work), a later
// cuMemAllocAsync of the same rounded size takes it back, and synchronize calls give cached
// bytes above the pool's release threshold (default 0) back to the OS, like the real driver.
#pragma once

#include <cstdint>

#include "state.hpp"

namespace tagmem::emu {

// What every synchronize does once its wait is over: frees `device`'s cached pool blocks above
// its release threshold, as the real driver does, and returns the device's sticky error.
CUresult finish_synchronize(int device);
// A device-wide synchronize: waits for every stream of `device`, then finish_synchronize.
CUresult synchronize_device(int device);
// Frees every block made in `generation` of `device`'s context (context teardown).
void release_context_allocations(lock&, int device, uint64_t generation);

}  // namespace tagmem::emu
