// handoff_messages.hpp — what the processes of a job say to each other when one hands device
// memory to another (Note [handoff] in service.hpp), and the decoders of those bytes.
//
// Framed by peers::unix_channel (descriptors ride on a GIVE). As peers/messages.hpp's decoders,
// every decoder returns a checked value or throws PEER: it never reads past the end, never sizes
// anything from a count the bytes cannot hold, and refuses trailing bytes; the fuzzer
// (tests/fuzz/rendezvous_fuzz.cpp) reaches each of them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "peers/process_identity.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::peers {
class wire_writer;
class wire_reader;
}  // namespace tagmem::peers

namespace tagmem::handoff {

inline constexpr std::uint32_t kHandoffProtocolVersion = 1;
// The most handles one GIVE carries (and so the most descriptors in flight per pair of processes,
// since a giver waits for TAKEN before its next GIVE).
inline constexpr std::size_t kMaxGiveParts = 16;

// Frame types; from 101 so that they never read as a group's (peers/messages.hpp).
enum : std::uint32_t {
  kHoffHello = 101,  // giver → taker
  kHoffWelcome,      // taker → giver
  kHoffRefuse,       // taker → giver, then close
  kHoffGive,         // giver → taker, with descriptors
  kHoffTaken,        // taker → giver
  kHoffDone,         // giver → taker, then close
};

using gpu_uuid = std::array<unsigned char, 16>;
std::string uuid_hex(const gpu_uuid& u);

// Who a process is, as it tells the other side.
struct claim {
  std::string job;
  gpu_uuid uuid{};
  std::uint64_t granularity = 0;
  peers::process_identity who;
};

// A claim on the wire (also inside the IPC messages, ipc_messages.hpp).
void put_claim(peers::wire_writer& w, const claim& c);
claim get_claim(peers::wire_reader& r);

struct hello {
  claim from;
  // What the giver's offload unmaps (the taker's estimate of what comes).
  std::uint64_t offer_bytes = 0;
};
std::string encode_hello(const hello& h);
// The version, read first and alone, so that another build is named as such.
std::uint32_t peek_handoff_version(const std::string& payload);
hello decode_hello(const std::string& payload);

enum class taker_state : std::uint32_t { expecting = 1, reloading = 2 };

struct welcome {
  claim from;
  taker_state state = taker_state::expecting;
  std::uint64_t want_bytes = 0;
  std::uint64_t largest_useful = 0;  // no handle larger than this is of use
  std::uint64_t announced_ns = 0;    // CLOCK_BOOTTIME: older announcements are served first
};
std::string encode_welcome(const welcome& w);
welcome decode_welcome(const std::string& payload);

struct refuse {
  tagmem_status status = TAGMEM_ERROR_PEER;
  std::string reason;
};
std::string encode_refuse(const refuse& r);
refuse decode_refuse(const std::string& payload);

// Handles of these sizes, one descriptor each, in order.
struct give {
  std::uint64_t seq = 0;
  std::vector<std::uint64_t> sizes;  // 1..kMaxGiveParts
};
std::string encode_give(const give& g);
give decode_give(const std::string& payload);

// The taker kept the first `accepted` handles of GIVE `seq` and wants `want_bytes` more.
struct taken {
  std::uint64_t seq = 0;
  std::uint32_t accepted = 0;
  std::uint64_t want_bytes = 0;
};
std::string encode_taken(const taken& t);
taken decode_taken(const std::string& payload);

struct done {
  std::uint64_t given_bytes = 0;
};
std::string encode_done(const done& d);
done decode_done(const std::string& payload);

}  // namespace tagmem::handoff
