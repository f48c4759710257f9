// outbox.hpp — the giving side: sessions with the job's takers, and the hand-over of each handle
// an offload unmaps.
//
// open() lists the takers of the job and GPU, connects, greets each (HELLO → WELCOME or REFUSE,
// bounded by greeting_timeout_ms) and checks who answered (trust.hpp) before any descriptor
// moves. offer() then runs on the offloading thread for each unmapped handle: the first session,
// reloading takers first and then the earliest announced, that wants that many bytes gets it
// (export as a POSIX fd, GIVE, wait for TAKEN); the giver keeps the handle until TAKEN says it
// was taken, then drops its own reference with a plain cuMemRelease: the memory lives on in the
// taker, nothing goes back to the driver, so Note [release aftermath] does not count it. A
// handle that cannot be exported, is not taken, or meets a session that fails (the taker exited,
// refused, or stayed silent past TAGMEM_HANDOFF_TIMEOUT_MS) stays the caller's and goes to the
// driver as without handoff. close_all() says DONE and closes.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "device/physical_flow.hpp"
#include "handoff/counters.hpp"
#include "handoff/handoff_point.hpp"
#include "handoff/identity.hpp"

namespace tagmem {
class device;
}

namespace tagmem::handoff {

class outbox final : public physical_sink {
 public:
  outbox(device& dev, const identity& id, counters& stats) : dev_(dev), id_(id), stats_(stats) {}
  ~outbox() { close_all(); }
  outbox(const outbox&) = delete;
  outbox& operator=(const outbox&) = delete;

  // Greets the takers listening now; returns whether any session wants memory.
  bool open(std::size_t offer_bytes) noexcept;
  // A session over a channel connected by other means, no greeting: wants anything until its
  // first TAKEN says otherwise (tests of the data path).
  void attach(std::unique_ptr<peers::unix_channel> ch);
  void close_all() noexcept;
  std::size_t sessions() const noexcept;

 private:
  struct session {
    std::unique_ptr<peers::unix_channel> ch;
    std::uint64_t want = 0;
    std::uint64_t largest = 0;
    bool reloading = false;
    std::uint64_t announced_ns = 0;
    std::uint64_t seq = 0;
    std::uint64_t given = 0;
  };
  enum class outcome { taken, kept };  // a failed session throws
  bool do_wants(std::size_t bytes) const noexcept override;
  bool do_offer(physical_part p) noexcept override;
  void greet(const receiver_address& a) noexcept;
  outcome give_one(session& s, physical_part p);

  device& dev_;
  const identity& id_;
  counters& stats_;
  mutable std::mutex mutex_;  // a leaf apart from the socket waits under it (bounded)
  std::vector<session> sessions_;
};

}  // namespace tagmem::handoff
