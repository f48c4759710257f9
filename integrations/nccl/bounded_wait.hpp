// bounded_wait.hpp — waiting for a device with a deadline.
//
// The driver's waits (cuCtxSynchronize, cuStreamSynchronize) block until the device is done,
// which is forever when a kernel waits for a peer that died in the middle of a collective. Pause
// and resume promise that every wait is bounded, so each such wait runs on a helper thread and
// the caller waits for it only until a deadline. A wait that outlives its deadline goes on in the
// background (a "late" wait): the caller reports TIMEOUT without touching anything the device's
// pending work still uses, and hands the late wait what must happen once that work has ended
// (giving back the host memory a copy writes, unmapping memory a copy fills). Each device has at
// most one late wait; whoever works with the device next settles it first, within its own
// deadline.
//
// Called with the record table's mutex held (pause and resume); the helper threads never take
// it: they only call the driver and run the hand-over, which must not touch the records either.
#pragma once

#include <cuda.h>

#include <chrono>
#include <functional>

namespace tagmem::nccl {

using deadline = std::chrono::steady_clock::time_point;
deadline deadline_after(int timeout_ms);

struct wait_outcome {
  bool in_time = false;            // false: the wait goes on; `if_late` runs when it ends
  CUresult status = CUDA_SUCCESS;  // the driver's answer, when in time
};

// Runs `wait` (a blocking driver call that names its context or stream) on a helper thread,
// after the device's late wait (if any) has ended, and waits for it until `until`. When it does
// not end in time, `if_late` runs on the helper thread right after it ends, with `context`
// (`device`'s primary context) current. Without a thread to wait on, waits on the caller's,
// unbounded.
wait_outcome wait_bounded(int device, CUcontext context, deadline until,
                          std::function<CUresult()> wait, std::function<void()> if_late);

// Whether some late wait or its hand-over is still going (it uses the runtime's devices and
// host store, which must outlive it).
bool late_wait_running();

// Waits until the late wait of `device` (if any) and its hand-over have ended; false when it
// is still going at `until`.
bool settle_late_wait(int device, deadline until);
// The same for every device; false (and *device set to the first still busy) when one is going.
bool settle_late_waits(deadline until, int* device);

}  // namespace tagmem::nccl
