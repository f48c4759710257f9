// rendezvous_fuzz.cpp — libFuzzer target over every decoder of what processes of a job send each
// other: the frame header (unix_channel.hpp), each payload of the NCCL rendezvous (messages.hpp)
// and of handoff (handoff/handoff_messages.hpp), with bytes as a peer could send them. The first
// input byte picks the decoder, the rest is the payload.
//
// A decoder may accept the bytes or throw tagmem::error with PEER; anything else — another
// exception (bad_alloc from a count sized before it was checked, out_of_range), a crash, a read
// past the end under ASan — is a finding. What a decoder accepts must survive a round trip:
// encoding it and decoding again gives the same encoding.
// Built as tagmem_fuzz_rendezvous (TAGMEM_BUILD_FUZZERS=ON, tests/sanitizers.sh runs it) and
// replayed over tests/fuzz/rendezvous_corpus in every build (rendezvous_replay_test.cpp).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.hpp"
#include "collective_messages.hpp"
#include "handoff/handoff_messages.hpp"
#include "peers/messages.hpp"
#include "peers/unix_channel.hpp"

namespace {

using namespace tagmem::nccl;
using namespace tagmem::peers;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "[rendezvous fuzz] %s\n", what);
  std::abort();
}

// Decodes, and if accepted checks that encode∘decode is a fixed point.
template <class Decode, class Encode>
void round_trip(const std::string& in, Decode decode, Encode encode) {
  std::string once;
  try {
    once = encode(decode(in));
  } catch (const tagmem::error& e) {
    if (e.code() != TAGMEM_ERROR_PEER) finding("a decoder threw something other than PEER");
    return;
  } catch (...) {
    finding("a decoder threw something other than tagmem::error");
  }
  try {
    if (encode(decode(once)) != once) finding("a decoded message does not survive a round trip");
  } catch (...) {
    finding("a re-encoded message is refused");
  }
}

void frame(const std::string& in) {
  if (in.size() < kFrameHeaderBytes + 1) return;
  std::size_t fds = static_cast<unsigned char>(in[kFrameHeaderBytes]);
  try {
    frame_header h = decode_frame_header(in.data(), fds, "fuzz", "fuzzing");
    if (h.length > kMaxPayload || h.fds != fds) finding("a bad frame header was accepted");
    std::string again = encode_frame_header(h.type, h.length, h.fds);
    if (again != in.substr(0, kFrameHeaderBytes)) finding("a frame header does not round-trip");
  } catch (const tagmem::error& e) {
    if (e.code() != TAGMEM_ERROR_PEER) finding("the frame header check threw something else");
  } catch (...) {
    finding("the frame header check threw something other than tagmem::error");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 18) {
    case 0:
      round_trip(in, decode_hello, encode_hello);
      break;
    case 1:
      round_trip(in, decode_welcome, encode_welcome);
      break;
    case 2:
      round_trip(in, decode_abort, encode_abort);
      break;
    case 3:
      round_trip(in, decode_routed, encode_routed);
      break;
    case 4:
      round_trip(in, decode_outcome, encode_outcome);
      break;
    case 5:
      round_trip(in, decode_list, encode_list);
      break;
    case 6:
      round_trip(in, decode_match_letter, encode_match_letter);
      break;
    case 7:
      round_trip(in, decode_claims, encode_claims);
      break;
    case 8:
      round_trip(in, decode_decisions, encode_decisions);
      break;
    case 9:
      round_trip(in, decode_needs, encode_needs);
      break;
    case 10:
      round_trip(in, decode_handle_letter, encode_handle_letter);
      break;
    case 11:
      frame(in);
      break;
    case 12:
      round_trip(in, tagmem::handoff::decode_hello, tagmem::handoff::encode_hello);
      break;
    case 13:
      round_trip(in, tagmem::handoff::decode_welcome, tagmem::handoff::encode_welcome);
      break;
    case 14:
      round_trip(in, tagmem::handoff::decode_refuse, tagmem::handoff::encode_refuse);
      break;
    case 15:
      round_trip(in, tagmem::handoff::decode_give, tagmem::handoff::encode_give);
      break;
    case 16:
      round_trip(in, tagmem::handoff::decode_taken, tagmem::handoff::encode_taken);
      break;
    case 17:
      round_trip(in, tagmem::handoff::decode_done, tagmem::handoff::encode_done);
      break;
  }
  return 0;
}
