// wire.hpp — how the processes of a group encode what they tell each other.
//
// Little-endian fixed-width integers and length-prefixed strings appended to a std::string, read
// back with bounds checks: a message that ends early or is malformed throws PEER instead of
// reading past its end, and a count read from a message is checked against the bytes left
// before anything is sized from it, so a peer's bytes never decide how much memory is taken.
// (Peers of other users are kept out by the directory and credentials, peers of other jobs by
// the job identity; this guards against bugs, stray connections and fuzzed bytes.)
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace tagmem::peers {

class wire_writer {
 public:
  wire_writer& u32(std::uint32_t v) { return raw(&v, sizeof v); }
  wire_writer& u64(std::uint64_t v) { return raw(&v, sizeof v); }
  wire_writer& i32(std::int32_t v) { return raw(&v, sizeof v); }
  wire_writer& str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  wire_writer& raw(const void* p, std::size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string out_;
};

class wire_reader {
 public:
  explicit wire_reader(const std::string& in) : in_(in) {}
  explicit wire_reader(std::string&&) = delete;  // it keeps a reference
  std::uint32_t u32() { return raw<std::uint32_t>(); }
  std::uint64_t u64() { return raw<std::uint64_t>(); }
  std::int32_t i32() { return raw<std::int32_t>(); }
  std::string str() {
    std::uint32_t n = u32();
    need(n);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // A count of items that take at least `min_item_bytes` each: more than the bytes left can
  // hold throws PEER.
  std::uint32_t count(std::size_t min_item_bytes) {
    std::uint32_t n = u32();
    if (min_item_bytes && n > (in_.size() - pos_) / min_item_bytes)
      fail(TAGMEM_ERROR_PEER, "a peer sent a count larger than its message");
    return n;
  }
  bool done() const { return pos_ == in_.size(); }
  // Throws PEER if bytes are left over.
  void finish() {
    if (!done()) fail(TAGMEM_ERROR_PEER, "a peer sent a message with trailing bytes");
  }

 private:
  template <class T>
  T raw() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  void need(std::size_t n) {
    if (in_.size() - pos_ < n) fail(TAGMEM_ERROR_PEER, "a peer sent a truncated message");
  }
  const std::string& in_;
  std::size_t pos_ = 0;
};

// Encodes a list of strings as one.
inline std::string pack_list(const std::vector<std::string>& items) {
  wire_writer w;
  w.u32(static_cast<std::uint32_t>(items.size()));
  for (const auto& s : items) w.str(s);
  return w.take();
}

inline std::vector<std::string> unpack_list(const std::string& packed) {
  wire_reader r(packed);
  std::vector<std::string> out(r.count(sizeof(std::uint32_t)));
  for (auto& s : out) s = r.str();
  r.finish();
  return out;
}

}  // namespace tagmem::peers
