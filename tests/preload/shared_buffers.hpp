// shared_buffers.hpp — the two-rank scenario of shared NCCL-style buffers, run by both processes.
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

#include "nccl_way.hpp"
#include "peer.hpp"

namespace tagmem::preload_test {

struct scenario_options {
  int cycles = 3;
  int timeout_ms = 30000;
  bool compact = false;  // every buffer 2 MiB (the granularity)
};

// One rank's side of the scenario. run() is the whole of it; the pieces are public for tests
// that run other steps between them (the pause fault sweep).
class shared_scenario {
 public:
  shared_scenario(int rank, control& peer, std::string group, const scenario_options& opt);

  std::vector<std::string> run();
  const std::vector<std::string>& failures() const { return failures_; }
  void expect(bool ok, const std::string& what);
  // Both ranks reach the same named point.
  void step(const char* name, int cycle);
  void setup();
  // Fresh random bytes into every buffer (each rank its own halves of the shared ones).
  void write_cycle(int cycle);
  void verify_all(int cycle, const std::string& when);
  // After a failed pause or resume: every buffer is mapped at all its addresses or at none, and
  // those mapped hold cycle `cycle`'s bytes.
  void verify_whole_or_gone(int cycle, const std::string& when);
  void pause_and_check();
  void resume_and_check(int cycle);
  void teardown();

 private:
  void check_bytes(const buffer& b, std::size_t offset, std::uint64_t s, std::size_t n,
                   const std::string& what);
  // A shared buffer owned by `owner`, seen through `b`.
  void check_shared(const buffer& b, int owner, std::size_t index, int cycle,
                    const std::string& what);
  std::vector<const buffer*> released_buffers() const;
  static std::size_t total(const std::vector<buffer>& v);
  // After a resume: handles still work, and a buffer exported again is mapped a second time.
  void share_again_after_resume();

  int me_, other_;
  control& peer_;
  std::string group_;
  scenario_options opt_;
  std::vector<std::string> failures_;
  std::uint64_t baseline_allocations_ = 0, baseline_mappings_ = 0;
  std::vector<buffer> local_, exported_, imported_, second_imports_;
  buffer classic_big_, classic_small_, host_;
};

// Runs rank `rank` (0 or 1) of the scenario; returns the failed checks (empty: all passed).
std::vector<std::string> run_shared_buffers(int rank, control& peer, const std::string& group,
                                            const scenario_options& opt);

}  // namespace tagmem::preload_test
