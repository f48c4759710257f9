// give_way.cpp — see give_way.hpp.
#include "offload/give_way.hpp"

#include "observe/log.hpp"
#include "observe/trace.hpp"

namespace tagmem {

give_way::~give_way() {
  stop();
  if (word_) dev_.ways().give_back(word_);
}

void give_way::start(std::chrono::milliseconds bound) noexcept {
  if (word_ || !dev_.peers()) return;
  word_ = dev_.ways().lend();
  bound_ = bound;
  keep();  // closed from the first piece on when a reload copies now
}

void give_way::keep() noexcept {
  if (!active()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - polled_ < poll_every) return;
  polled_ = now;
  const bool copying = dev_.peers()->others_copying();
  const auto closed_in_all =
      closed_for_ + (closed_ ? now - closed_since_ : std::chrono::steady_clock::duration::zero());
  if (copying && closed_in_all >= bound_) {
    if (logging(log_level::info)) {
      log_line(
          "handoff give-way-ended bound_ms=" +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(bound_).count()) +
          " reason=\"the job's reload copied longer than TAGMEM_HANDOFF_TIMEOUT_MS\"");
    }
    stop();
    return;
  }
  if (copying == closed_) return;
  if (copying) {
    closed_since_ = now;
  } else {
    closed_for_ += now - closed_since_;
  }
  set(copying);
}

void give_way::stop() noexcept {
  if (!word_ || stopped_) return;
  if (closed_) set(false);
  stopped_ = true;
}

void give_way::set(bool closed) noexcept {
  way_words::set(word_, closed);
  closed_ = closed;
  trace::counter("copies giving way", closed ? 1 : 0);
}

}  // namespace tagmem
