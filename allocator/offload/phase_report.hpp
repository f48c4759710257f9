// phase_report.hpp — what one phase switch (offload, reload, swap) tells the log and the trace.
//
// The offload engine makes one for each switch. When neither TAGMEM_LOG nor tracing is on it
// holds nothing and costs a branch. Otherwise it notes the tags' mapped bytes and copy counters
// first; when the switch ends it writes one log line (tags, bytes, milliseconds, GB/s, free
// device memory, pinned host bytes) and closes the switch's span, its device-timed copies and
// the counters (docs/observe.md). The caller holds every tag's lock for the report's lifetime.
#pragma once

#include <exception>
#include <memory>

#include "host/host_store.hpp"
#include "tags/tag.hpp"

namespace tagmem {

class phase_report {
 public:
  phase_report(device& dev, tag* const* outs, std::size_t out_count, tagmem_offload_mode mode,
               tag* const* ins, std::size_t in_count, host_store& store) noexcept;
  ~phase_report();  // reports success unless failed() was called
  phase_report(const phase_report&) = delete;
  phase_report& operator=(const phase_report&) = delete;

  // The switch throws `e`: the line says so, with each tag's state after it.
  void failed(const std::exception& e) noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tagmem
