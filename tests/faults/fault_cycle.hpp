// fault_cycle.hpp — the allocate / offload / reload / swap cycle the fault sweep breaks.
//
// A cycle is a fixed list of steps over three tags on device 0: `weights` and `optim` keep their
// bytes (BACKUP), `kv` is dropped and refilled (DISCARD), as in the trainer/engine workload. It
// allocates small and large blocks, offloads, reloads, swaps both ways, frees one
// allocation of an offloaded tag, frees the rest (two of them from a thread's exit destructors)
// and empties the cache, so it ends where it began. Every step is one tagmem call; the harness
// touches device memory only directly (the emulator's device memory is host memory), so the driver
// calls counted during a cycle are tagmem's alone and a fault armed for the n-th of them always
// lands inside tagmem.
//
// After a step fails, complete() finishes what the step was for (offloads what is still mapped,
// reloads what is still offloaded, allocates or frees again): the "retry after the fault" that
// must succeed. check_bytes() compares every allocation of every resident tag whose contents are
// defined; settle() refills `kv` whenever it comes back from a DISCARD offload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tagmem/tagmem.h"

namespace tagmem::reliability {

class fault_cycle {
 public:
  // free_in_exit: a free from a pthread key destructor of a thread that called tagmem before
  // (its metadata heap live until then); free_as_exit_first_call: from one that never did.
  enum class kind {
    allocate,
    free,
    free_in_exit,
    free_as_exit_first_call,
    offload,
    reload,
    swap,
    empty_cache
  };
  struct step {
    kind what;
    std::size_t index = 0;  // allocate / free: which allocation
    std::vector<const char*> out, in;
    tagmem_offload_mode mode = TAGMEM_BACKUP;
  };

  explicit fault_cycle(std::uint64_t seed);

  const std::vector<step>& steps() const noexcept { return steps_; }
  std::string describe(std::size_t i) const;

  // Runs step i (one tagmem call) and returns its status.
  tagmem_status run(std::size_t i);
  // tagmem_last_error() of the thread that made the last call (a step at a thread's exit runs on
  // a thread of its own).
  std::string last_error() const;
  // After step i failed: finishes its work; "" or what went wrong.
  std::string complete(std::size_t i);
  // Refills tags that came back from a DISCARD offload; notes those offloaded with DISCARD.
  void settle();
  // "" or which allocation lost its bytes.
  std::string check_bytes();

  std::uint64_t bytes_verified() const noexcept { return bytes_verified_; }

  static constexpr const char* kTags[3] = {"weights", "optim", "kv"};

 private:
  struct allocation {
    const char* tag;
    std::size_t size;
    void* ptr = nullptr;
    bool freed = false;
    std::vector<unsigned char> bytes;
  };
  tagmem_status run_call(std::size_t i);
  void fill(allocation& a);
  tagmem_tag_stats stats(const char* tag) const;
  std::vector<const char*> not_yet_offloaded(const std::vector<const char*>& tags) const;
  std::vector<const char*> still_offloaded(const std::vector<const char*>& tags) const;

  std::mt19937_64 rng_;
  std::vector<allocation> allocations_;
  std::vector<step> steps_;
  bool lost_[3] = {false, false, false};  // contents dropped by a DISCARD offload
  std::uint64_t bytes_verified_ = 0;
  std::string exit_error_;  // set when the last call failed on an exiting thread
};

}  // namespace tagmem::reliability
