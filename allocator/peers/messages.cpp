// messages.cpp — encoding and checked decoding of the group's payloads (see header).
#include "peers/messages.hpp"

#include "base/error.hpp"
#include "peers/wire.hpp"

namespace tagmem::peers {

tagmem_status decode_status(std::uint32_t v) {
  return v <= TAGMEM_ERROR_INTERNAL ? static_cast<tagmem_status>(v) : TAGMEM_ERROR_PEER;
}

bool decode_bool(std::uint32_t v) {
  if (v > 1) fail(TAGMEM_ERROR_PEER, "a peer sent a malformed flag");
  return v == 1;
}

const char* op_name(group_op op) {
  switch (op) {
    case group_op::pause:
      return "pause";
    case group_op::resume:
      return "resume";
    case group_op::replicate:
      return "replicated offload";
  }
  return "an unknown operation";
}

std::string encode_hello(const hello& h) {
  return wire_writer()
      .u32(kProtocolVersion)
      .u32(static_cast<std::uint32_t>(h.op))
      .i32(h.rank)
      .i32(h.size)
      .str(h.job)
      .str(h.group)
      .u32(h.ready ? 1 : 0)
      .u32(h.why_code)
      .str(h.why_not)
      .take();
}

std::uint32_t peek_version(const std::string& payload) { return wire_reader(payload).u32(); }

hello decode_hello(const std::string& payload) {
  wire_reader r(payload);
  if (r.u32() != kProtocolVersion) fail(TAGMEM_ERROR_PEER, "a hello of another protocol");
  hello h;
  std::uint32_t op = r.u32();
  if (op < 1 || op > 3) fail(TAGMEM_ERROR_PEER, "a hello with an unknown operation");
  h.op = static_cast<group_op>(op);
  h.rank = r.i32();
  h.size = r.i32();
  h.job = r.str();
  h.group = r.str();
  h.ready = decode_bool(r.u32());
  h.why_code = decode_status(r.u32());
  h.why_not = r.str();
  r.finish();
  return h;
}

std::string encode_welcome(const welcome& w) {
  wire_writer out;
  out.str(w.job).str(w.group).u32(static_cast<std::uint32_t>(w.members.size()));
  for (const process_identity& p : w.members)
    out.u64(static_cast<std::uint64_t>(p.pid)).u64(p.start);
  return out.take();
}

welcome decode_welcome(const std::string& payload) {
  wire_reader r(payload);
  welcome w;
  w.job = r.str();
  w.group = r.str();
  w.members.resize(r.count(2 * sizeof(std::uint64_t)));
  for (process_identity& p : w.members) {
    std::uint64_t pid = r.u64();
    if (pid == 0 || pid > 0x7fffffff) fail(TAGMEM_ERROR_PEER, "a welcome with a bad pid");
    p.pid = static_cast<pid_t>(pid);
    p.start = r.u64();
  }
  r.finish();
  return w;
}

std::string encode_abort(const abort_note& a) {
  return wire_writer().u32(a.code).str(a.text).take();
}

abort_note decode_abort(const std::string& payload) {
  wire_reader r(payload);
  abort_note a;
  a.code = decode_status(r.u32());
  if (a.code == TAGMEM_SUCCESS) a.code = TAGMEM_ERROR_PEER;
  a.text = r.str();
  r.finish();
  return a;
}

std::string encode_routed(const routed_blob& b) {
  return wire_writer().i32(b.rank).str(b.blob).take();
}

routed_blob decode_routed(const std::string& payload) {
  wire_reader r(payload);
  routed_blob b;
  b.rank = r.i32();
  b.blob = r.str();
  r.finish();
  return b;
}

std::string encode_outcome(const rank_outcome& o) {
  return wire_writer().u32(o.status).str(o.message).take();
}

rank_outcome decode_outcome(const std::string& payload) {
  wire_reader r(payload);
  rank_outcome o;
  o.status = decode_status(r.u32());
  o.message = r.str();
  r.finish();
  return o;
}

std::string encode_list(const std::vector<std::string>& items) { return pack_list(items); }
std::vector<std::string> decode_list(const std::string& payload) { return unpack_list(payload); }

}  // namespace tagmem::peers
