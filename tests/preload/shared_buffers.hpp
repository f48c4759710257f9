// shared_buffers.hpp — the two-rank scenario of issue 5, item 4, run by both processes.
//
// Each rank (rank r uses emulated device r) makes what NCCL makes: local buffers, buffers it
// exports to the other rank as POSIX fds over the control socket, the other rank's buffers
// imported and mapped, a cuMemAlloc buffer large enough for the shim to serve, a small one it
// passes through, and a host-located buffer. Both write random bytes into their own buffers and
// into the halves of the other's exported buffers reserved for them, so every shared buffer
// holds bytes from both processes. Then, for several cycles, both pause the `nccl` tag
// together and check that the memory is gone (stats, emulated device bytes, RSS, faults on
// touch) while host-located and passed-through memory stays; resume together and check every
// byte at every address; and write fresh bytes across the processes, which proves the shared
// buffers are shared again. After the first cycle each rank exports one buffer once more and
// the other maps it a second time, so later cycles also cover exports made after a resume.
// Finally everything is freed NCCL's way and nothing may be left behind.
#pragma once

#include <string>
#include <vector>

#include "peer.hpp"

namespace tagmem::preload_test {

struct scenario_options {
  int cycles = 3;
  int timeout_ms = 30000;
};

// Runs rank `rank` (0 or 1) of the scenario; returns the failed checks (empty: all passed).
std::vector<std::string> run_shared_buffers(int rank, control& peer, const std::string& group,
                                            const scenario_options& opt);

}  // namespace tagmem::preload_test
