// process_identity.hpp — which process, exactly, a rank of a group is.
//
// A pid alone can be reused once its process exits; the pid with the process's start time (in
// clock ticks since boot, from /proc/<pid>/stat) names one process for the life of the machine.
// The shim keeps this identity with every import (the process that owns the buffer) and with
// every export (the processes found to map it), so that a buffer is never handed to, or taken
// from, a process it was not shared with — even one that joined the same group by mistake.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace tagmem::peers {

struct process_identity {
  pid_t pid = 0;
  std::uint64_t start = 0;  // 0: unknown (no /proc); then only the pid is compared

  bool same_as(const process_identity& o) const {
    return pid == o.pid && (start == 0 || o.start == 0 || start == o.start);
  }
  std::string describe() const;  // "pid 123 (started at tick 456)"
};

// The identity of a live process; start stays 0 when /proc cannot tell it.
process_identity identity_of(pid_t pid);

}  // namespace tagmem::peers
