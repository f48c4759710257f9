// collective_messages.cpp — encoding and checked decoding of the pause and resume payloads.
#include "collective_messages.hpp"

#include "api/runtime.hpp"
#include "peers/messages.hpp"
#include "peers/wire.hpp"

namespace tagmem::nccl {

using peers::decode_bool;
using peers::wire_reader;
using peers::wire_writer;

std::string encode_match_letter(const match_letter& l) {
  return wire_writer().u64(l.importer_id).u64(l.owner_id).take();
}

match_letter decode_match_letter(const std::string& payload) {
  wire_reader r(payload);
  match_letter l;
  l.importer_id = r.u64();
  l.owner_id = r.u64();
  r.finish();
  return l;
}

std::string encode_claims(const std::vector<claim>& claims) {
  wire_writer w;
  for (const claim& c : claims) w.i32(c.owner).u64(c.id).u32(c.can_release ? 1 : 0);
  return w.take();
}

std::vector<claim> decode_claims(const std::string& payload) {
  wire_reader r(payload);
  std::vector<claim> out;
  while (!r.done()) {
    claim c;
    c.owner = r.i32();
    c.id = r.u64();
    c.can_release = decode_bool(r.u32());
    out.push_back(c);
  }
  return out;
}

std::string encode_decisions(const std::vector<decision>& d) {
  wire_writer w;
  for (const decision& x : d) w.u64(x.id).u32(x.release ? 1 : 0);
  return w.take();
}

std::vector<decision> decode_decisions(const std::string& payload) {
  wire_reader r(payload);
  std::vector<decision> out;
  while (!r.done()) {
    decision x;
    x.id = r.u64();
    x.release = decode_bool(r.u32());
    out.push_back(x);
  }
  return out;
}

std::string encode_needs(const std::vector<need>& n) {
  wire_writer w;
  for (const need& x : n) w.i32(x.owner).u64(x.id);
  return w.take();
}

std::vector<need> decode_needs(const std::string& payload) {
  wire_reader r(payload);
  std::vector<need> out;
  while (!r.done()) {
    need x;
    x.owner = r.i32();
    x.id = r.u64();
    out.push_back(x);
  }
  return out;
}

std::string encode_handle_letter(const handle_letter& l) {
  return wire_writer().u64(l.id).u32(l.ok ? 1 : 0).take();
}

handle_letter decode_handle_letter(const std::string& payload) {
  wire_reader r(payload);
  handle_letter l;
  l.id = r.u64();
  l.ok = decode_bool(r.u32());
  r.finish();
  return l;
}

}  // namespace tagmem::nccl
