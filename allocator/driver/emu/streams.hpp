// streams.hpp — streams that really run asynchronously, and the legacy NULL stream.
//
// Note [emu streams]: tagmem's worst bugs are ordering bugs — unmapping or reusing memory that a
// queued copy still reads or writes. To make them show up, a created stream is a FIFO of
// operations executed by a worker thread of its own, so a copy enqueued on it completes at some
// later time, as on a GPU; only synchronize, query and events tell when. CU_STREAM_PER_THREAD
// is such a stream too, a blocking one of each thread's own, as in CUDA. The legacy NULL stream
// (also CU_STREAM_LEGACY) is synchronous: an operation on it first waits for what the device's
// blocking streams (those created without CU_STREAM_NON_BLOCKING) have queued so far, then runs
// inline in the caller's thread. Only a wait on it (cuStreamWaitEvent) is queued instead, as on a
// GPU, where the caller does not block: a hidden blocking stream of the device holds it, so later
// work of the legacy stream and of the blocking streams waits for it, and non-blocking streams
// do not. An error an operation returns while it executes becomes its device's sticky error
// (Note [emu sticky errors]).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "state.hpp"

namespace tagmem::emu {

struct stream;
using operation = std::function<CUresult()>;

// Where an operation runs: a created stream, or the NULL stream of `device`.
struct target {
  std::shared_ptr<stream> queue;  // null for the NULL stream
  int device = 0;
};

// Resolves a CUstream argument: CUDA_ERROR_INVALID_HANDLE for an unknown stream, else the
// errors of its context (contexts.hpp). The NULL stream belongs to the current context.
CUresult resolve_stream(lock&, CUstream handle, target* out);

// Runs `op` in stream order; see Note [emu streams]. Call without the global lock.
void submit(const target& where, operation op);
// Queues a wait (cuStreamWaitEvent): on the NULL stream it does not block the caller.
void submit_wait(const target& where, operation wait);
// Waits for everything queued on `where` so far (NULL stream: on the blocking streams).
void wait_idle(const target& where);
bool idle(const target& where);

// Waits for everything queued so far on every stream of `device`.
void wait_device_streams(int device);
// Waits for every stream of every device (cuMemFreeHost and cuMemHostUnregister do).
void synchronize_all_devices();
// Lets the streams of a context generation that is being torn down run dry.
void drain_device_streams(int device, uint64_t generation);

}  // namespace tagmem::emu
