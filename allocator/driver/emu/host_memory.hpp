// host_memory.hpp — page-locked host memory: cuMemHostAlloc and cuMemHostRegister ranges.
//
// Nothing is actually locked in memory (that would need privileges CI lacks); the emulator
// tracks the ranges, counts their bytes, and uses them for one behaviour that matters to
// callers: an asynchronous copy with pageable host memory is staged or completed before the call
// returns, as the real driver does, while one with pinned memory is truly asynchronous
// (copies.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "state.hpp"

namespace tagmem::emu {

// Whether [addr, addr+size) lies inside one pinned range.
bool is_pinned(lock&, uintptr_t addr, size_t size);

}  // namespace tagmem::emu
