// copy_clock.hpp — copy pieces timed on the device, as spans of TAGMEM_TRACE (observe/trace.hpp).
//
// Note [trace clock]: device times are placed on the host clock through one event per phase
// switch, recorded on a copy stream before the switch queues its first copy, with the host time
// taken just before the record. The device reaches the event at or after that time (later only
// if the stream was still busy, which between switches it is not), so a copy is never placed
// later than it ran, and its start is never placed before it was queued. Nothing waits for the
// event: tracing does not hold the switch up.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "observe/trace.hpp"

namespace tagmem::trace {

// Device-timed copy pieces of one phase switch, on the calling thread (Note [trace clock]).
class copy_clock {
 public:
  // Records the base event on `stream` (Note [trace clock]); `context` is made current meanwhile.
  copy_clock(CUcontext context, CUstream stream) noexcept;
  // Waits for every recorded piece, turns them into spans, frees the events.
  ~copy_clock();
  copy_clock(const copy_clock&) = delete;
  copy_clock& operator=(const copy_clock&) = delete;

  struct impl;  // the pieces recorded so far (copy_clock.cpp)

 private:
  impl* impl_ = nullptr;
};

// After queueing one copy on `stream`: records its end for the copy_clock of this thread's
// current phase switch (nothing if there is none). `to_host`: device to host.
void copy_queued(CUstream stream, bool to_host, const char* tag, std::size_t bytes) noexcept;

}  // namespace tagmem::trace
