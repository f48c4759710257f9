// messages.hpp — the payloads the processes of a group exchange, and their decoders.
//
// Every decoder takes bytes from another process and either returns a checked value or throws
// PEER: it never reads past the end, never sizes anything from a count the bytes cannot hold,
// never yields an enum value that is not one, and refuses trailing bytes. They are all here,
// apart from the code that acts on them, so that one fuzzer (tests/fuzz/rendezvous_fuzz.cpp)
// reaches every one of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "peers/process_identity.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::peers {

enum class group_op : std::uint32_t { pause = 1, resume = 2, replicate = 3 };
const char* op_name(group_op op);

// 3: matching is established by the owner (two mail rounds), claims carry no indices.
inline constexpr std::uint32_t kProtocolVersion = 3;

// Message types on the wire (unix_channel's frame type).
enum : std::uint32_t {
  kHello = 1,
  kWelcome,
  kAbort,
  kGather,
  kGathered,
  kMailTurn,
  kMailItem,
  kMailEnd,
  kMailDeliver,
  kMailAck,
  kMailDone,
};

// A rank's first message to rank 0. The version is read first and alone (peek_version), so a
// different build is named as such rather than as garbage.
struct hello {
  group_op op = group_op::pause;
  int rank = 0;
  int size = 0;
  std::string job;
  std::string group;
  bool ready = true;
  tagmem_status why_code = TAGMEM_SUCCESS;
  std::string why_not;
};
std::string encode_hello(const hello& h);
std::uint32_t peek_version(const std::string& payload);
hello decode_hello(const std::string& payload);

// Rank 0's answer once everyone joined: the job and group it serves and every rank's process.
struct welcome {
  std::string job;
  std::string group;
  std::vector<process_identity> members;  // by rank
};
std::string encode_welcome(const welcome& w);
welcome decode_welcome(const std::string& payload);

struct abort_note {
  tagmem_status code = TAGMEM_ERROR_PEER;
  std::string text;
};
std::string encode_abort(const abort_note& a);
abort_note decode_abort(const std::string& payload);

// A letter on its way: kMailItem names the receiver, kMailDeliver the sender.
struct routed_blob {
  int rank = 0;
  std::string blob;
};
std::string encode_routed(const routed_blob& r);
routed_blob decode_routed(const std::string& payload);

struct rank_outcome {
  tagmem_status status = TAGMEM_SUCCESS;
  std::string message;
};
std::string encode_outcome(const rank_outcome& o);
rank_outcome decode_outcome(const std::string& payload);

// Runs `decode` on bytes that came from `sender`: a malformed payload becomes PEER naming the
// sender and the step, so that the message says who sent it.
template <class F>
auto decode_from(const std::string& sender, const char* what, F&& decode) -> decltype(decode()) {
  try {
    return decode();
  } catch (const error& e) {
    fail(TAGMEM_ERROR_PEER,
         sender + " sent a malformed message while " + what + " (" + e.what() + ")");
  }
}

// A flag or a status from another process: a flag other than 0 or 1 is PEER; a status this build
// does not know becomes PEER.
bool decode_bool(std::uint32_t v);
tagmem_status decode_status(std::uint32_t v);

// Lists of strings (all_gather's answer).
std::string encode_list(const std::vector<std::string>& items);
std::vector<std::string> decode_list(const std::string& payload);

}  // namespace tagmem::peers
