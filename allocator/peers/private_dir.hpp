// private_dir.hpp — the directory where the processes of a node meet.
//
// TAGMEM_PEER_DIR if set, else TAGMEM_NCCL_DIR (its older name), else $XDG_RUNTIME_DIR/tagmem when
// XDG_RUNTIME_DIR is set (the session's own directory, which no other user may enter). With
// neither, the first process of a job that loads the shim picks a per-job directory itself when it
// loads: $TMPDIR (else /tmp) /tagmem-<uid>-<32 random hex digits>, and sets TAGMEM_NCCL_DIR to it,
// so that the processes it starts — the ranks, under a launcher run with LD_PRELOAD — inherit it.
// The name comes from getrandom() and no other user can read another's environment, so nobody can
// create it first; it is created at first use with mkdir (which fails on an existing name, as
// mkdtemp does) and never removed by tagmem, so its name, once it has been seen, cannot be taken
// over.
//
// Whatever the source, the directory is used only if it is a real directory (not a symbolic
// link) owned by this user that no one else may enter; it is created with mode 0700 if missing.
// Anything else is an error naming the path and what is wrong, so a rendezvous socket can never
// sit where another user could connect to it, replace it or block it.
#pragma once

#include <string>

namespace tagmem::peers {

// The checked directory (created if needed). Throws PEER with the reason, INVALID_ARGUMENT when
// there is no directory to use.
std::string private_dir();

// Whether this very process chose the directory when it loaded (its peers share it only if they
// descend from this process): error messages say so.
bool private_dir_chosen_here();

}  // namespace tagmem::peers
