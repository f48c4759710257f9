// taker.cpp — importing what a giver hands over (see header).
#include "handoff/taker.hpp"

#include <algorithm>

#include "device/device.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "observe/trace.hpp"
#include "peers/messages.hpp"

namespace tagmem::handoff {
namespace {

void note(const std::string& line) noexcept {
  if (logging(log_level::info)) log_line("handoff " + line);
}

// Greets the giver; returns whether memory may come from it.
bool welcome_giver(const identity& id, want_book& book, counters& stats, peers::unix_channel& ch,
                   std::atomic<std::uint64_t>& coming) {
  peers::message m = ch.receive(id.timeout_ms, "waiting for a giver's hello");
  if (m.type != kHoffHello || !m.fds.empty()) {
    fail(TAGMEM_ERROR_PEER, ch.peer_name() + " opened with something other than a hello");
  }
  std::string why;
  hello h;
  if (peers::decode_from(ch.peer_name(), "greeting", [&] {
        return peek_handoff_version(m.payload);
      }) != kHandoffProtocolVersion) {
    why = ch.peer_name() + " speaks another handoff protocol version (another tagmem build)";
  } else {
    h = peers::decode_from(ch.peer_name(), "greeting", [&] { return decode_hello(m.payload); });
    const peers::peer_credentials cred = ch.credentials();
    why = mismatch(id.me, cred, peers::identity_of(cred.pid), h.from);
  }
  if (!why.empty()) {
    ++stats.refused_peers;
    note("refuse " + why);
    ch.send(kHoffRefuse, encode_refuse({TAGMEM_ERROR_PEER, why}), {}, id.timeout_ms, "refusing");
    return false;
  }
  const want_book::view v = book.now();
  if (!v.announcing) {
    ch.send(kHoffRefuse, encode_refuse({TAGMEM_ERROR_PEER, "not taking memory now"}), {},
            id.timeout_ms, "refusing");
    return false;
  }
  coming = std::min<std::uint64_t>(h.offer_bytes, v.want);
  ch.send(kHoffWelcome, encode_welcome({id.mine, v.state, v.want, v.largest, v.announced_ns}), {},
          id.timeout_ms, "welcoming a giver");
  return true;
}

// Imports the handles of one GIVE that are wanted; returns how many (a prefix).
std::uint32_t import_given(device& dev, const identity& id, want_book& book, inbox& held,
                           counters& stats, const give& g, peers::owned_fds& fds,
                           std::atomic<std::uint64_t>& coming) {
  const auto& api = driver::api();
  context_guard guard(dev.context());
  std::uint32_t accepted = 0;
  for (std::size_t i = 0; i < g.sizes.size(); ++i) {
    const std::uint64_t size = g.sizes[i];
    if (size % id.me.granularity != 0 || !book.take(size)) break;
    trace::span span("take", nullptr, size);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = api.cuMemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i])),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemAllocationProp prop{};
    if (r == CUDA_SUCCESS) {
      r = api.cuMemGetAllocationPropertiesFromHandle(&prop, h);
      if (r == CUDA_SUCCESS && (prop.type != CU_MEM_ALLOCATION_TYPE_PINNED ||
                                prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)) {
        r = CUDA_ERROR_INVALID_VALUE;  // not device memory: of no use to a reload
      }
      if (r != CUDA_SUCCESS) api.cuMemRelease(h);
    }
    // Before it is held, so that what maps held memory counts it once (Note [mapped ahead]);
    // only this thread writes `coming`.
    coming = coming - std::min<std::uint64_t>(coming, size);
    // The descriptor stays with the handle, so that the memory can be handed on (Note [one hop]);
    // the inbox records it before the handle can be taken.
    if (r != CUDA_SUCCESS || !held.put({h, static_cast<std::size_t>(size)}, fds.take(i))) {
      if (r == CUDA_SUCCESS) api.cuMemRelease(h);
      book.untake(size);
      note("import-failed error=" + driver::describe(r));
      break;
    }
    stats.received_bytes += size;
    ++stats.received_handles;
    ++accepted;
  }
  fds.reset();  // those of the handles not taken
  return accepted;
}

}  // namespace

void serve_giver(device& dev, const identity& id, want_book& book, inbox& held, counters& stats,
                 peers::unix_channel& ch, bool greet, std::atomic<std::uint64_t>& coming) noexcept {
  struct session_end {
    std::atomic<std::uint64_t>& coming;
    ~session_end() { coming = 0; }
  } end{coming};
  try {
    if (greet && !welcome_giver(id, book, stats, ch, coming)) return;
    for (;;) {
      peers::message m = ch.receive(id.timeout_ms, "waiting for a giver's next handles");
      if (m.type == kHoffDone && m.fds.empty()) {
        peers::decode_from(ch.peer_name(), "finishing", [&] { return decode_done(m.payload); });
        return;
      }
      if (m.type != kHoffGive) {
        fail(TAGMEM_ERROR_PEER, ch.peer_name() + " sent an unexpected message");
      }
      const give g =
          peers::decode_from(ch.peer_name(), "giving", [&] { return decode_give(m.payload); });
      if (m.fds.size() != g.sizes.size()) {
        fail(TAGMEM_ERROR_PEER, ch.peer_name() + " gave a different number of handles and sizes");
      }
      const std::uint32_t accepted = import_given(dev, id, book, held, stats, g, m.fds, coming);
      ch.send(kHoffTaken, encode_taken({g.seq, accepted, book.now().want}), {}, id.timeout_ms,
              "acknowledging handles");
    }
  } catch (const std::exception& e) {
    note(std::string("session-ended reason=\"") + e.what() + "\"");
  }
}

}  // namespace tagmem::handoff
