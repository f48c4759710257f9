// step_log.hpp — TAGMEM_LOG and trace for an NCCL pause or resume.
//
// One line at info level per pause or resume of this process (group, rank, milliseconds, the
// bytes released or brought back and the pinned host bytes holding them), also when it fails,
// and one trace span (docs/observe.md). When neither is on it costs a branch.
#pragma once

#include <exception>
#include <functional>

namespace tagmem::nccl {

enum class step { pause, resume };

// Runs `body`, the pause or resume of `group` (may be null: the default) as `rank`; rethrows what
// it throws after logging it.
void logged_step(step which, const char* group, int rank, const std::function<void()>& body);

}  // namespace tagmem::nccl
