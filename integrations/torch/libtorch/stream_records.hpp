// stream_records.hpp — tensor.record_stream() for tagmem's global mode.
//
// Note [recorded streams]: PyTorch calls the allocator's recordStream when a tensor is used on a
// stream other than the one it was allocated on (tensor.record_stream(), ProcessGroupNCCL,
// multi-stream code). Its own allocator then keeps the block out of reuse until events recorded
// on those streams at the free have completed. tagmem's frees are already stream-ordered: a block
// freed on stream F is reused at once on F and, on any other stream, only after that stream waits
// for the work F had queued at the free (block_pool.hpp, Note [stream-ordered reuse]). So a free
// of a block with recorded streams is made on a per-device join stream J that first waits (events
// recorded at the free) for the freeing stream and every recorded stream: every later reuse waits
// for all of them (on the device; on the host for the legacy default stream, as tagmem's
// NULL-stream allocations do), and no application stream gains a dependency. Nobody allocates
// on J, so nothing reuses such a block "at once". A free while one of those streams is being
// captured into a CUDA graph is ordered on the freeing stream alone (joining would pull J into
// the capture; global mode gives graphs no private pool anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tagmem::libtorch {

// Notes that the allocation starting at `ptr` is used on `stream` (recordStream). Thread-safe.
void record_stream(void* ptr, cudaStream_t stream);

// Frees `ptr` (a tagmem allocation made for `stream` on `device`) so that no stream reuses it
// before the work queued at this call on `stream` and on every stream recorded for it is done.
// Returns tagmem's status; on a CUDA failure while joining, falls back to waiting on the host
// for those streams before freeing, so that ordering still holds. Thread-safe.
int free_after_recorded_streams(void* ptr, int device, cudaStream_t stream);

// How many frees so far waited for recorded streams (for tests). Thread-safe.
std::size_t joined_frees();

}  // namespace tagmem::libtorch
