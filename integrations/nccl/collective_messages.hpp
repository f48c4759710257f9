// collective_messages.hpp — what the ranks tell each other during the NCCL pause and resume, and
// the checked decoders of it (the group's own messages are in peers/messages.hpp). Every decoder
// takes bytes from another process and returns a checked value or throws PEER, as those do; the
// rendezvous fuzzer (tests/fuzz/rendezvous_fuzz.cpp) reaches every one of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tagmem::nccl {

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
