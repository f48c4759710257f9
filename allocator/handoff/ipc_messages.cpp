// ipc_messages.cpp — the IPC handle and messages, encoded and checked (see header).
#include "handoff/ipc_messages.hpp"

#include <cstring>

#include "base/error.hpp"
#include "peers/wire.hpp"

namespace tagmem::handoff {

// Layout: magic u32, version u32, pid i32, zero u32, start u64, id u64, secret 16, uuid 16.
std::array<unsigned char, kIpcHandleBytes> encode_ipc_handle(const ipc_handle& h) {
  peers::wire_writer w;
  w.u32(kIpcHandleMagic);
  w.u32(kIpcProtocolVersion);
  w.i32(h.owner.pid);
  w.u32(0);
  w.u64(h.owner.start);
  w.u64(h.id);
  std::string out = w.take();
  out.append(reinterpret_cast<const char*>(h.secret.data()), h.secret.size());
  out.append(reinterpret_cast<const char*>(h.uuid.data()), h.uuid.size());
  std::array<unsigned char, kIpcHandleBytes> bytes{};
  static_assert(4 * 4 + 2 * 8 + 16 + 16 == kIpcHandleBytes);
  std::memcpy(bytes.data(), out.data(), bytes.size());
  return bytes;
}

ipc_handle decode_ipc_handle(const unsigned char* bytes) {
  TAGMEM_EXPECTS(bytes, TAGMEM_ERROR_INVALID_ARGUMENT, "the IPC handle is NULL");
  const std::string in(reinterpret_cast<const char*>(bytes), kIpcHandleBytes);
  peers::wire_reader r(in);
  TAGMEM_EXPECTS(r.u32() == kIpcHandleMagic, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "not a tagmem IPC handle (made by tagmem_ipc_export)");
  TAGMEM_EXPECTS(r.u32() == kIpcProtocolVersion, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "a tagmem IPC handle of another version (another tagmem build exported it)");
  ipc_handle h;
  h.owner.pid = r.i32();
  const std::uint32_t zero = r.u32();
  h.owner.start = r.u64();
  h.id = r.u64();
  TAGMEM_EXPECTS(h.owner.pid > 0 && zero == 0 && h.id != 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "a damaged tagmem IPC handle");
  std::memcpy(h.secret.data(), bytes + 32, h.secret.size());
  std::memcpy(h.uuid.data(), bytes + 48, h.uuid.size());
  return h;
}

namespace {

void put_secret(peers::wire_writer& w, const ipc_secret& s) {
  w.str(std::string(reinterpret_cast<const char*>(s.data()), s.size()));
}

ipc_secret get_secret(peers::wire_reader& r) {
  const std::string s = r.str();
  if (s.size() != ipc_secret{}.size())
    fail(TAGMEM_ERROR_PEER, "a peer sent a secret of wrong size");
  ipc_secret out{};
  std::memcpy(out.data(), s.data(), out.size());
  return out;
}

}  // namespace

std::string encode_ipc_open(const ipc_open& o) {
  peers::wire_writer w;
  w.u32(kIpcProtocolVersion);
  put_claim(w, o.from);
  w.u64(o.id);
  put_secret(w, o.secret);
  return w.take();
}

ipc_open decode_ipc_open(const std::string& payload) {
  peers::wire_reader r(payload);
  if (r.u32() != kIpcProtocolVersion) {
    fail(TAGMEM_ERROR_PEER, "a peer speaks another IPC protocol version (another tagmem build)");
  }
  ipc_open o;
  o.from = get_claim(r);
  o.id = r.u64();
  o.secret = get_secret(r);
  r.finish();
  return o;
}

std::string encode_ipc_mapped(const ipc_mapped& m) {
  peers::wire_writer w;
  w.u64(m.offset);
  w.u64(m.bytes);
  w.u32(static_cast<std::uint32_t>(m.sizes.size()));
  for (std::uint64_t s : m.sizes) w.u64(s);
  return w.take();
}

ipc_mapped decode_ipc_mapped(const std::string& payload) {
  peers::wire_reader r(payload);
  ipc_mapped m;
  m.offset = r.u64();
  m.bytes = r.u64();
  const std::uint32_t n = r.count(sizeof(std::uint64_t));
  if (n == 0 || n > kMaxIpcParts) fail(TAGMEM_ERROR_PEER, "a peer sent a wrong number of handles");
  m.sizes.resize(n);
  std::uint64_t span = 0;
  for (auto& s : m.sizes) {
    s = r.u64();
    if (s == 0 || s > (std::uint64_t{1} << 48))
      fail(TAGMEM_ERROR_PEER, "a peer sent a bad handle size");
    span += s;
  }
  r.finish();
  if (m.bytes == 0 || m.offset > span || m.bytes > span - m.offset) {
    fail(TAGMEM_ERROR_PEER, "a peer sent a range outside the handles it sent");
  }
  return m;
}

}  // namespace tagmem::handoff
