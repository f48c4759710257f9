// collective_messages.hpp — what the ranks tell each other during the NCCL pause and resume, and
// the checked decoders of it (the group's own messages are in peers/messages.hpp). Every decoder
// takes bytes from another process and returns a checked value or throws PEER, as those do; the
// rendezvous fuzzer (tests/fuzz/rendezvous_fuzz.cpp) reaches every one of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tagmem::nccl {

// Pause, matching (Note [matching shared allocations] in collective.cpp): an importer's
// duplicate of the fd it imported as its record `importer_id` (owner_id 0), mailed to every other
// rank; and the owner's answer to the importer it found holding one of its exports: its record
// `owner_id`, with a duplicate of that export, so that the importer checks it too.
struct match_letter {
  std::uint64_t importer_id = 0;
  std::uint64_t owner_id = 0;
};
std::string encode_match_letter(const match_letter& l);
match_letter decode_match_letter(const std::string& payload);

// Pause: an importer tells the owner which of its buffers it maps and whether it can release its
// side. The owner serves it only if it found the importer's process holding the buffer's fd.
struct claim {
  int owner = 0;
  std::uint64_t id = 0;
  bool can_release = false;
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
