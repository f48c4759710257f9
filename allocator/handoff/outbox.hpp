// outbox.hpp — the giving side: sessions with the job's takers, and the hand-over of each handle
// an offload unmaps.
//
// open() lists the takers of the job and GPU, connects, greets each (HELLO → WELCOME or REFUSE,
// bounded by greeting_timeout_ms) and checks who answered (trust.hpp) before any descriptor
// moves. offer() then runs on the offloading thread for each unmapped handle: the first session,
// reloading takers first and then the earliest announced, that wants that many bytes (less what
// is in flight to it) gets it: exported as a POSIX fd and sent (GIVE), without waiting for the
// answer, so that the next handle goes as soon as it is unmapped. The giver keeps each handle
// until its TAKEN arrives (read as they come, and all of them by close_all, each within
// TAGMEM_HANDOFF_TIMEOUT_MS); then it drops its own reference with a plain cuMemRelease: the
// memory lives on in the taker, nothing goes back to the driver, so Note [release aftermath]
// does not count it. A handle that cannot be exported stays the caller's and goes to the driver
// as without handoff; one in flight that is not taken, or whose session fails (the taker exited,
// refused, or stayed silent), goes to the device's release queue. close_all() collects the
// answers, says DONE and closes.
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
  struct in_flight {
    std::uint64_t seq = 0;
    physical_part part;
  };
  struct session {
    std::unique_ptr<peers::unix_channel> ch;
    std::uint64_t want = 0;  // as of the last TAKEN, in flight included
    std::uint64_t largest = 0;
    bool reloading = false;
    std::uint64_t announced_ns = 0;
    std::uint64_t seq = 0;
    std::uint64_t given = 0;
    std::vector<in_flight> pending;  // sent, not answered yet, in order
    std::uint64_t pending_bytes = 0;
    bool fits(std::size_t bytes) const noexcept {
      return want >= pending_bytes + bytes && largest >= bytes;
    }
  };
  bool do_wants(std::size_t bytes) const noexcept override;
  bool do_offer(physical_part p) noexcept override;
  void greet(const receiver_address& a, std::size_t offer_bytes) noexcept;
  // Exports and sends `p`; false when it cannot be exported (the caller keeps it). Throws when
  // the session fails (the handle is still the caller's).
  bool send_one(session& s, physical_part p);
  // Reads the answers that have arrived (all of them with `all`, waiting for each). Throws when
  // the session fails.
  void collect(session& s, bool all);
  // A failed session: what was in flight goes to the driver.
  void drop(session& s) noexcept;
  void to_driver(physical_part p) noexcept;

  device& dev_;
  const identity& id_;
  counters& stats_;
  mutable std::mutex mutex_;  // a leaf apart from the socket waits under it (bounded)
  std::vector<session> sessions_;
};

}  // namespace tagmem::handoff
