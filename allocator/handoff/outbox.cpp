// outbox.cpp — handing unmapped handles to the job's takers (see header).
#include "handoff/outbox.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>

#include "device/device.hpp"
#include "device/received_fds.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "observe/trace.hpp"
#include "peers/messages.hpp"

namespace tagmem::handoff {
namespace {

void note(const std::string& line) noexcept {
  if (logging(log_level::info)) log_line("handoff " + line);
}

}  // namespace

std::size_t outbox::sessions() const noexcept {
  std::lock_guard lock(mutex_);
  return sessions_.size();
}

void outbox::attach(std::unique_ptr<peers::unix_channel> ch) {
  std::lock_guard lock(mutex_);
  session s;
  s.ch = std::move(ch);
  s.want = std::numeric_limits<std::uint64_t>::max();
  s.largest = std::numeric_limits<std::uint64_t>::max();
  sessions_.push_back(std::move(s));
}

void outbox::greet(const receiver_address& a, std::size_t offer_bytes) noexcept {
  const int fd = connect_to(a);
  if (fd < 0) {
    if (errno == ECONNREFUSED) remove_if_abandoned(a);  // EAGAIN: busy, skipped this time
    return;
  }
  auto ch = std::make_unique<peers::unix_channel>(fd, "handoff taker pid " + std::to_string(a.pid));
  try {
    ch->send(kHoffHello, encode_hello({id_.mine, offer_bytes}), {}, id_.timeout_ms,
             "greeting a taker");
    peers::message m = ch->receive(greeting_timeout_ms(id_), "waiting for a taker's welcome");
    if (m.type == kHoffRefuse) {
      const refuse r =
          peers::decode_from(ch->peer_name(), "refusing", [&] { return decode_refuse(m.payload); });
      note("refused-by pid=" + std::to_string(a.pid) + " reason=\"" + r.reason + "\"");
      return;
    }
    if (m.type != kHoffWelcome || !m.fds.empty()) {
      fail(TAGMEM_ERROR_PEER, ch->peer_name() + " answered a hello with something else");
    }
    const welcome w =
        peers::decode_from(ch->peer_name(), "welcoming", [&] { return decode_welcome(m.payload); });
    const peers::peer_credentials cred = ch->credentials();
    // The pid in the socket's name, the kernel's and the claimed one must all agree: a reused pid
    // cannot own a dead owner's bound socket, so memory only goes to the process listening there.
    std::string why = cred.pid == a.pid
                          ? mismatch(id_.me, cred, peers::identity_of(cred.pid), w.from)
                          : "the socket of pid " + std::to_string(a.pid) + " is served by pid " +
                                std::to_string(cred.pid);
    if (!why.empty()) {
      ++stats_.refused_peers;
      note("refuse " + why);
      return;
    }
    if (w.want_bytes == 0) return;
    std::lock_guard lock(mutex_);
    session s;
    s.ch = std::move(ch);
    s.want = w.want_bytes;
    s.largest = w.largest_useful;
    s.reloading = w.state == taker_state::reloading;
    s.announced_ns = w.announced_ns;
    sessions_.push_back(std::move(s));
  } catch (const std::exception& e) {
    note(std::string("skip reason=\"") + e.what() + "\"");
  }
}

bool outbox::open(std::size_t offer_bytes) noexcept {
  try {
    for (const receiver_address& a : list_receivers(id_.dir, id_.me.job, id_.me.uuid)) {
      greet(a, offer_bytes);
    }
  } catch (const std::exception& e) {
    note(std::string("discovery-failed reason=\"") + e.what() + "\"");
  }
  std::lock_guard lock(mutex_);
  // Reloading takers first, then the earliest announced.
  std::stable_sort(sessions_.begin(), sessions_.end(), [](const session& a, const session& b) {
    if (a.reloading != b.reloading) return a.reloading;
    return a.announced_ns < b.announced_ns;
  });
  return !sessions_.empty();
}

void outbox::close_all() noexcept {
  std::vector<session> all;
  {
    std::lock_guard lock(mutex_);
    all.swap(sessions_);
  }
  for (session& s : all) {
    try {
      collect(s, true);
      s.ch->send(kHoffDone, encode_done({s.given}), {}, id_.timeout_ms, "saying done");
    } catch (const std::exception& e) {  // gone: what was in flight goes to the driver
      note(std::string("session-failed reason=\"") + e.what() + "\"");
      drop(s);
    }
  }
}

bool outbox::do_wants(std::size_t bytes) const noexcept {
  std::lock_guard lock(mutex_);
  return std::any_of(sessions_.begin(), sessions_.end(),
                     [&](const session& s) { return s.fits(bytes); });
}

void outbox::to_driver(physical_part p) noexcept {
  try {
    dev_.releases().push(p.handle, p.size);
  } catch (...) {  // no room for the record: released here
    received_fds::release_handle(p.handle);
  }
}

void outbox::drop(session& s) noexcept {
  for (const in_flight& f : s.pending) to_driver(f.part);
  s.pending.clear();
  s.pending_bytes = 0;
}

bool outbox::send_one(session& s, physical_part p) {
  // An imported handle goes as the descriptor it came with (Note [one hop]); one created before
  // handoff was on cannot be shared and goes to the driver as without handoff.
  trace::span span("give", nullptr, p.size);
  const int fd = received_fds::shareable_fd(p.handle);
  if (fd < 0) return false;
  peers::owned_fds exported;
  exported.push_back(fd);
  s.pending.reserve(s.pending.size() + 1);  // before the send: nothing can fail after it
  const std::uint64_t seq = ++s.seq;
  s.ch->send(kHoffGive, encode_give({seq, {p.size}}), exported.view(), id_.timeout_ms,
             "handing over device memory");
  exported.reset();  // the kernel holds the description while it is in flight
  s.pending.push_back({seq, p});
  s.pending_bytes += p.size;
  return true;
}

void outbox::collect(session& s, bool all) {
  while (!s.pending.empty() && (all || s.ch->readable_now())) {
    peers::message m = s.ch->receive(id_.timeout_ms, "waiting for the taker to take device memory");
    if (m.type != kHoffTaken || !m.fds.empty()) {
      fail(TAGMEM_ERROR_PEER, s.ch->peer_name() + " answered a hand-over with something else");
    }
    const taken t =
        peers::decode_from(s.ch->peer_name(), "taking", [&] { return decode_taken(m.payload); });
    if (t.seq != s.pending.front().seq) {
      fail(TAGMEM_ERROR_PEER, s.ch->peer_name() + " acknowledged another hand-over");
    }
    const physical_part p = s.pending.front().part;
    s.pending.erase(s.pending.begin());
    s.pending_bytes -= p.size;
    s.want = t.want_bytes;
    if (t.accepted == 0) {
      to_driver(p);
      continue;
    }
    // The taker holds its own reference now: this one goes, and no memory reaches the driver.
    trace::span span("given", nullptr, p.size);
    if (received_fds::release_handle(p.handle) != CUDA_SUCCESS) {
      try {
        dev_.releases().push(p.handle, 0);  // tried again later; 0 bytes: they stay in use
      } catch (...) {
      }
    }
    s.given += p.size;
    stats_.given_bytes += p.size;
    ++stats_.given_handles;
  }
}

bool outbox::do_offer(physical_part p) noexcept {
  std::lock_guard lock(mutex_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    try {
      collect(*it, false);  // fresher figures, and handles taken drop their last reference
      if (it->fits(p.size)) return send_one(*it, p);
      ++it;
      continue;
    } catch (const std::exception& e) {
      note(std::string("session-failed reason=\"") + e.what() + "\"");
    }
    drop(*it);
    it = sessions_.erase(it);  // closed; the handle offered is still this process's
  }
  return false;
}

}  // namespace tagmem::handoff
