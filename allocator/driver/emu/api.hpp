// api.hpp — how the emulated driver's entry points are declared and entered.
//
// Every driver entry point is an extern "C" function with the exact signature <cuda.h> declares
// (its macros pick the versioned symbol, e.g. cuMemcpyHtoDAsync → cuMemcpyHtoDAsync_v2), made
// visible despite the project's -fvisibility=hidden. Its first statement is TAGMEM_EMU_ENTRY,
// which counts the call, returns an injected fault if one is due (before any side effect, see
// Note [emu fault injection] in faults.hpp) and rejects calls made before cuInit. The four entry
// points the real driver serves before cuInit use TAGMEM_EMU_ENTRY_ANY_TIME instead.
//
// Note [emu layers]: the emulator's files form layers; a file calls (and includes) only files of
// the layers below it, so no two files depend on each other. From the bottom:
//   1. state, faults, errors: the lock, devices, live-object counters, fault injection;
//      test_hold: the one-shot holds of copies, maps and releases that tests arm;
//      modules: loaded modules and the copy kernel they offer;
//      address_space, physical: the device address space and cuMemCreate'd memory;
//   2. contexts: primary contexts, the calling thread's current context, sticky errors;
//   3. streams: stream queues and their workers, stream handles resolved against contexts;
//   4. classic: cuMemAlloc and the stream-ordered pool, which waits on streams;
//      host_memory: pinned host memory, which waits on streams; vmm, devices;
//   5. events, copies, memops: work queued on streams against the memory of the layers below;
//      synchronize: the entry points that act on every layer (stream and context synchronize
//      trim the pool; releasing a primary context drains its streams and frees its allocations).
#pragma once

#include <cuda.h>

#include "faults.hpp"
#include "state.hpp"

#define TAGMEM_EMU_EXPORT extern "C" __attribute__((visibility("default")))

// `name` is pasted before it can expand, so cuda.h's versioning macros (cuMemAlloc →
// cuMemAlloc_v2) leave the entry's identity alone.
#define TAGMEM_EMU_ENTRY_ANY_TIME(name) TAGMEM_EMU_ENTER_(::tagmem::emu::entry::name##_, false)
#define TAGMEM_EMU_ENTRY(name) TAGMEM_EMU_ENTER_(::tagmem::emu::entry::name##_, true)

#define TAGMEM_EMU_ENTER_(id, needs_init)                                                 \
  do {                                                                                    \
    if (CUresult injected_ = ::tagmem::emu::on_call(id); injected_ != CUDA_SUCCESS)       \
      return injected_;                                                                   \
    if ((needs_init) && !::tagmem::emu::initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)
