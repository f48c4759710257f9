// want_book.hpp — how much memory this process takes from the job's other processes now, and
// whether it announces itself at all (Note [handoff] in service.hpp).
//
// A process takes memory (announces itself) while it reloads, after tagmem_handoff_expect until
// tagmem_handoff_cancel, and with TAGMEM_HANDOFF_ANNOUNCE=after_offload while it has offloaded
// tags. It wants the bytes of the reload, else the larger of the expected and the offloaded
// bytes, less what it received since that target was set (what it held then included). The
// largest handle it takes is the reload's largest span of runs side by side; before a reload, the
// larger of the mapping limit and the offloaded tags' largest span of mappings side by side (what
// that reload will announce), so that a peer's large handles given up before this process
// reloads (an engine's kv cache at its pause) are taken rather than sent to the driver.
#pragma once

#include <cstdint>
#include <mutex>

#include "handoff/handoff_messages.hpp"

namespace tagmem::handoff {

class want_book {
 public:
  struct view {
    bool announcing = false;
    taker_state state = taker_state::expecting;
    std::uint64_t want = 0;
    std::uint64_t largest = 0;
    std::uint64_t announced_ns = 0;
  };
  want_book(bool after_offload, std::uint64_t default_largest)
      : after_offload_(after_offload), default_largest_(default_largest) {}

  // Each returns whether the process announces itself afterwards. `held`: the bytes held now.
  bool reloading(std::uint64_t wanted, std::uint64_t largest, std::uint64_t held);
  bool reload_done(std::uint64_t held);
  bool expect(std::uint64_t bytes, std::uint64_t held);
  bool cancel(std::uint64_t held);
  // `largest_span`: the offloaded tags' largest span of non-resident mappings side by side.
  bool offloaded(std::uint64_t bytes, std::uint64_t largest_span, std::uint64_t held);

  view now() const;
  // Counts `bytes` received when they are wanted and not larger than useful; false otherwise.
  bool take(std::uint64_t bytes);
  void untake(std::uint64_t bytes);

 private:
  bool retarget_locked(std::uint64_t held);
  view now_locked() const;

  const bool after_offload_;
  const std::uint64_t default_largest_;
  mutable std::mutex mutex_;  // a leaf
  bool reloading_ = false;
  std::uint64_t reload_want_ = 0, reload_largest_ = 0;
  bool expecting_ = false;
  std::uint64_t expect_bytes_ = 0;
  std::uint64_t offloaded_ = 0;
  std::uint64_t offloaded_largest_ = 0;
  std::uint64_t target_ = 0, received_ = 0;
  bool announcing_ = false;
  std::uint64_t announced_ns_ = 0;
};

}  // namespace tagmem::handoff
