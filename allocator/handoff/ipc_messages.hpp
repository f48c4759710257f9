// ipc_messages.hpp — the handle of an exported tagged range, and what an importing process and
// the exporting one say to each other (Note [ipc] in ipc_server.hpp).
//
// The handle is 64 bytes, the size of a cudaIpcMemHandle_t, so that the preload shim can carry it
// in one: it names the exporting process (pid and start time), the GPU, the export and a random
// secret. It grants nothing by itself: the exporter checks the importer's user, job and identity
// (trust.hpp) before any descriptor moves, and the secret must match the export's. Decoders, as
// handoff_messages.hpp's, return a checked value or throw PEER (INVALID_ARGUMENT for a handle).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "handoff/handoff_messages.hpp"

namespace tagmem::handoff {

inline constexpr std::size_t kIpcHandleBytes = 64;
inline constexpr std::uint32_t kIpcHandleMagic = 0x50494d54;  // "TMIP"
inline constexpr std::uint32_t kIpcProtocolVersion = 1;
// The most physical handles one export maps (a range lies inside one allocation, which reloads
// coalesce into few mappings).
inline constexpr std::size_t kMaxIpcParts = 64;

// Frame types; from 121, apart from the group's and handoff's.
enum : std::uint32_t {
  kIpcOpen = 121,  // importer → exporter
  kIpcMapped,      // exporter → importer, with descriptors
  kIpcRefuse,      // exporter → importer, then close
  kIpcClose,       // importer → exporter, then close
};

using ipc_secret = std::array<unsigned char, 16>;

struct ipc_handle {
  peers::process_identity owner;
  std::uint64_t id = 0;
  ipc_secret secret{};
  gpu_uuid uuid{};
};
std::array<unsigned char, kIpcHandleBytes> encode_ipc_handle(const ipc_handle& h);
// Throws INVALID_ARGUMENT for bytes that are not a tagmem IPC handle.
ipc_handle decode_ipc_handle(const unsigned char* bytes);

struct ipc_open {
  claim from;
  std::uint64_t id = 0;
  ipc_secret secret{};
};
std::string encode_ipc_open(const ipc_open& o);
ipc_open decode_ipc_open(const std::string& payload);

// The physical handles behind the export, one descriptor each, mapped side by side from the
// start of the span; the exported range starts `offset` bytes in and is `bytes` long.
struct ipc_mapped {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::vector<std::uint64_t> sizes;  // 1..kMaxIpcParts
};
std::string encode_ipc_mapped(const ipc_mapped& m);
ipc_mapped decode_ipc_mapped(const std::string& payload);

}  // namespace tagmem::handoff
