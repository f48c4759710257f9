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

// Frees cached pool blocks of `device` above its release threshold.
void trim_pool(lock&, int device);
// Frees every block made in `generation` of `device`'s context (context teardown).
void release_context_allocations(lock&, int device, uint64_t generation);

}  // namespace tagmem::emu
