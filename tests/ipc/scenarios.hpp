// scenarios.hpp — the peer processes of the IPC tests, driven over the control channel.
//
// `ipc_importer` answers one command per line:
//   open <handle>        → "opened <index> <bytes>" | "error <STATUS> <message>"
//   check <i> <seed>     → "same" | "differs"  (open range i against random_bytes(seed))
//   write <i> <seed>     → "written"
//   close <i>            → "closed" | "error ..."
//   cycle <handle> <n>   → "cycled" | "error ..."  (n opens and closes)
//   census               → "clean" | what leaked, against its start
//   exit
// `ipc_exporter` allocates 4 MiB in tag "x", writes random_bytes(seed) there, sends its handle,
// then answers "check <seed>" with "same" | "differs" until "exit" (or it is killed).
#pragma once

#include <cstddef>

namespace tagmem::ipc_test {

inline constexpr std::size_t kExporterBytes = std::size_t{4} << 20;

}  // namespace tagmem::ipc_test
