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

#include "peers/process_identity.hpp"
#include "api/runtime.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::nccl {

enum class group_op : std::uint32_t { pause = 1, resume = 2 };
const char* op_name(group_op op);

inline constexpr std::uint32_t kProtocolVersion = 2;

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

// Lists of strings (all_gather's answer).
std::string encode_list(const std::vector<std::string>& items);
std::vector<std::string> decode_list(const std::string& payload);

// ---- the collective's contents (collective.cpp) ---------------------------------------------

// Pause: an exporter's fd duplicates of record `id`, from index `first` of its exports.
struct export_letter {
  std::uint64_t id = 0;
  std::uint32_t first = 0;
};
std::string encode_export_letter(const export_letter& l);
export_letter decode_export_letter(const std::string& payload);

// Pause: an importer tells the owner which of its buffers it maps, whether it can release its
// side, and which of the owner's exports it matched in this pause.
struct claim {
  int owner = 0;
  std::uint64_t id = 0;
  bool can_release = false;
  std::vector<std::uint32_t> matched;
};
std::string encode_claims(const std::vector<claim>& claims);
std::vector<claim> decode_claims(const std::string& payload);

// Pause: an owner's verdict on a claimed buffer.
struct decision {
  std::uint64_t id = 0;
  bool release = false;
};
std::string encode_decisions(const std::vector<decision>& d);
std::vector<decision> decode_decisions(const std::string& payload);

// Resume: an importer asks an owner for a new handle of a released buffer.
struct need {
  int owner = 0;
  std::uint64_t id = 0;
};
std::string encode_needs(const std::vector<need>& n);
std::vector<need> decode_needs(const std::string& payload);

// Resume: an owner's new handle for buffer `id` (the fd rides along when ok).
struct handle_letter {
  std::uint64_t id = 0;
  bool ok = false;
};
std::string encode_handle_letter(const handle_letter& l);
handle_letter decode_handle_letter(const std::string& payload);

}  // namespace tagmem::nccl
