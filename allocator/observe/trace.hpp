// trace.hpp — TAGMEM_TRACE: phase switches as a Chrome / Perfetto trace, and as NVTX ranges.
//
// Tracing is on when TAGMEM_TRACE names a file (events are kept in memory and written there as
// JSON trace events) or when an NVTX tool such as Nsight Systems is attached (the same spans
// become NVTX ranges in the "tagmem" domain, next to the application's kernels). When neither,
// every hook is one relaxed load and a branch. What is recorded:
//  - spans (complete events) on the thread that does the work: a whole phase switch, its
//    planning, each unmap, each map, each background release batch, each pinning of host memory;
//  - one span per copy piece on a track per copy stream, timed on the device with events
//    (copy_clock.hpp, which needs the driver and so sits above it): the piece ends when the
//    device says so, not when the host looked;
//  - counters: mapped bytes per tag, pinned host bytes, free device memory.
// The file is rewritten whole (written beside it, then renamed) at exit, at tagmem_shutdown and at
// tagmem_trace_flush, so it is valid JSON at any time whatever the number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

namespace tagmem::trace {

extern std::atomic<bool> g_on;
inline bool on() noexcept { return g_on.load(std::memory_order_relaxed); }

// Reads TAGMEM_TRACE (and whether an NVTX tool is attached); called when tagmem initialises.
// The first time a path is set, registers the write at exit.
void configure() noexcept;

// Writes the events so far to TAGMEM_TRACE's path (nothing when no path is set). Throws
// INVALID_ARGUMENT naming the path when it cannot be written. Thread-safe.
void flush();
// At tagmem_shutdown: flush(), then forget the path and the events (the next tagmem_init starts a
// new trace), also when flush() throws. NVTX ranges go on if a tool is attached.
void close();

// What a span does to a counter when it ends.
enum class effect { none, mapped_up, mapped_down, pinned_up };

// A span on the calling thread from construction to destruction. `tag` (may be null) must live
// until the span ends; `bytes` goes into the event's arguments and, unless the span ends by an
// exception, into the counter `what` names.
class span {
 public:
  explicit span(const char* name, const char* tag = nullptr, std::size_t bytes = 0,
                effect what = effect::none) noexcept {
    if (on()) begin(name, tag, bytes, what);
  }
  ~span() {
    if (active_) end();
  }
  span(const span&) = delete;
  span& operator=(const span&) = delete;

 private:
  void begin(const char* name, const char* tag, std::size_t bytes, effect what) noexcept;
  void end() noexcept;

  bool active_ = false;
  bool nvtx_ = false;
  int unwinding_ = 0;  // exceptions in flight at the start: more at the end means it failed
  const char* name_ = nullptr;
  const char* tag_ = nullptr;
  std::size_t bytes_ = 0;
  effect what_ = effect::none;
  double start_us_ = 0;
};

// Sets a counter track to `value` now ("mapped_bytes trainer_weights", "host_pinned_bytes").
void counter(const std::string& name, std::uint64_t value) noexcept;
// Starts the mapped-bytes counter of `tag` at `value` (the base that map/unmap spans move).
void set_mapped(const char* tag, std::uint64_t value) noexcept;

// One device-timed copy piece as a span on the track of its copy stream (`stream` identifies
// the track; tracks are named "copies D2H n" / "copies H2D n"): copy_clock.hpp's output.
void copy_span(const void* stream, bool to_host, double start_us, double dur_us, const char* tag,
               std::size_t bytes) noexcept;
// Whether events are being kept for a file (TAGMEM_TRACE names one).
bool recording() noexcept;

// Microseconds on the trace's clock: the machine's monotonic clock, the same in every process.
double now_us() noexcept;

}  // namespace tagmem::trace
