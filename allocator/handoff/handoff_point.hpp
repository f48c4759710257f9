// handoff_point.hpp — where a process that takes memory listens, and how givers find it.
//
// In the job's private directory (peers/private_dir.hpp), a taker of job J on GPU U listens on
// hoff-<H>-<pid>.sock and holds hoff-<H>-<pid>.lock (peers::rendezvous_listener: the flock for
// its whole life), H = hash of J and U. The hash only picks files: job and UUID are compared in
// full in the hello. The pid lets several takers of one job and GPU listen at once. A giver lists
// the directory for the prefix; a socket whose owner died (connection refused, lock free) is
// removed by the giver that finds it. A process copying a reload marks it with hoff-<H>-<pid>.copy
// (copy_gate.hpp).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "handoff/handoff_messages.hpp"
#include "peers/rendezvous_point.hpp"

namespace tagmem::handoff {

struct receiver_address {
  peers::rendezvous_paths paths;
  pid_t pid = 0;  // from the name; checked against the kernel's word once connected
};

// This process's paths. Throws INVALID_ARGUMENT when they do not fit a Unix socket address.
peers::rendezvous_paths own_point(const std::string& dir, const std::string& job,
                                  const gpu_uuid& uuid);

// The takers of (job, GPU) listed in `dir`, this process left out.
std::vector<receiver_address> list_receivers(const std::string& dir, const std::string& job,
                                             const gpu_uuid& uuid);

// This process's copy mark, and every copy mark of (job, GPU) listed in `dir`, this process's
// included, each with the pid from its name.
std::string own_copy_mark(const std::string& dir, const std::string& job, const gpu_uuid& uuid);
std::vector<std::pair<std::string, pid_t>> list_copy_marks(const std::string& dir,
                                                           const std::string& job,
                                                           const gpu_uuid& uuid);

// A connected, non-blocking socket to `a`, or -1 with errno (ECONNREFUSED: nobody listens;
// EAGAIN: its backlog is full).
int connect_to(const receiver_address& a);

// After a refused connection: when the owner's lock is free (it is dead), unlinks the socket and
// the lock while holding it and returns true; when it is busy (alive, perhaps between bind and
// listen), false.
bool remove_if_abandoned(const receiver_address& a);

}  // namespace tagmem::handoff
