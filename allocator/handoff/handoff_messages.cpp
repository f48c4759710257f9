// handoff_messages.cpp — encoding and checked decoding of the handoff messages (see header).
#include "handoff/handoff_messages.hpp"

#include <cstdio>

#include "peers/messages.hpp"
#include "peers/wire.hpp"

namespace tagmem::handoff {
using peers::wire_reader;
using peers::wire_writer;

void put_claim(wire_writer& w, const claim& c) {
  w.str(c.job);
  w.str(std::string(reinterpret_cast<const char*>(c.uuid.data()), c.uuid.size()));
  w.u64(c.granularity);
  w.i32(c.who.pid);
  w.u64(c.who.start);
}

claim get_claim(wire_reader& r) {
  claim c;
  c.job = r.str();
  const std::string u = r.str();
  if (u.size() != c.uuid.size()) fail(TAGMEM_ERROR_PEER, "a peer sent a GPU UUID of wrong size");
  for (std::size_t i = 0; i < u.size(); ++i) c.uuid[i] = static_cast<unsigned char>(u[i]);
  c.granularity = r.u64();
  c.who.pid = r.i32();
  c.who.start = r.u64();
  if (c.who.pid <= 0) fail(TAGMEM_ERROR_PEER, "a peer sent an invalid pid");
  return c;
}

std::string uuid_hex(const gpu_uuid& u) {
  std::string s;
  for (unsigned char b : u) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", b);
    s += hex;
  }
  return s;
}

std::string encode_hello(const hello& h) {
  wire_writer w;
  w.u32(kHandoffProtocolVersion);
  put_claim(w, h.from);
  w.u64(h.offer_bytes);
  return w.take();
}

std::uint32_t peek_handoff_version(const std::string& payload) {
  wire_reader r(payload);
  return r.u32();
}

hello decode_hello(const std::string& payload) {
  wire_reader r(payload);
  if (r.u32() != kHandoffProtocolVersion) {
    fail(TAGMEM_ERROR_PEER, "a peer speaks another handoff protocol version");
  }
  hello h;
  h.from = get_claim(r);
  h.offer_bytes = r.u64();
  r.finish();
  return h;
}

std::string encode_welcome(const welcome& w) {
  wire_writer out;
  put_claim(out, w.from);
  out.u32(static_cast<std::uint32_t>(w.state));
  out.u64(w.want_bytes);
  out.u64(w.largest_useful);
  out.u64(w.announced_ns);
  return out.take();
}

welcome decode_welcome(const std::string& payload) {
  wire_reader r(payload);
  welcome w;
  w.from = get_claim(r);
  const std::uint32_t state = r.u32();
  if (state != 1 && state != 2) fail(TAGMEM_ERROR_PEER, "a peer sent an unknown taker state");
  w.state = static_cast<taker_state>(state);
  w.want_bytes = r.u64();
  w.largest_useful = r.u64();
  w.announced_ns = r.u64();
  r.finish();
  return w;
}

std::string encode_refuse(const refuse& f) {
  wire_writer w;
  w.u32(static_cast<std::uint32_t>(f.status));
  w.str(f.reason);
  return w.take();
}

refuse decode_refuse(const std::string& payload) {
  wire_reader r(payload);
  refuse f;
  f.status = peers::decode_status(r.u32());
  f.reason = r.str();
  r.finish();
  return f;
}

std::string encode_give(const give& g) {
  wire_writer w;
  w.u64(g.seq);
  w.u32(static_cast<std::uint32_t>(g.sizes.size()));
  for (std::uint64_t s : g.sizes) w.u64(s);
  return w.take();
}

give decode_give(const std::string& payload) {
  wire_reader r(payload);
  give g;
  g.seq = r.u64();
  const std::uint32_t n = r.count(sizeof(std::uint64_t));
  if (n == 0 || n > kMaxGiveParts) fail(TAGMEM_ERROR_PEER, "a peer gave a wrong number of handles");
  g.sizes.resize(n);
  for (auto& s : g.sizes) {
    s = r.u64();
    if (s == 0) fail(TAGMEM_ERROR_PEER, "a peer gave a handle of 0 bytes");
  }
  r.finish();
  return g;
}

std::string encode_taken(const taken& t) {
  wire_writer w;
  w.u64(t.seq);
  w.u32(t.accepted);
  w.u64(t.want_bytes);
  return w.take();
}

taken decode_taken(const std::string& payload) {
  wire_reader r(payload);
  taken t;
  t.seq = r.u64();
  t.accepted = r.u32();
  t.want_bytes = r.u64();
  r.finish();
  if (t.accepted > kMaxGiveParts) fail(TAGMEM_ERROR_PEER, "a peer took more handles than given");
  return t;
}

std::string encode_done(const done& d) {
  wire_writer w;
  w.u64(d.given_bytes);
  return w.take();
}

done decode_done(const std::string& payload) {
  wire_reader r(payload);
  done d;
  d.given_bytes = r.u64();
  r.finish();
  return d;
}

}  // namespace tagmem::handoff
