// private_dir.hpp — the directory where the processes of a node meet.
//
// TAGMEM_NCCL_DIR if set, else $XDG_RUNTIME_DIR/tagmem when XDG_RUNTIME_DIR is set, else
// /tmp/tagmem-<uid>. It is created with mode 0700 if missing; an existing one is used only if
// it is a real directory (not a symbolic link) owned by this user that no one else may enter.
// Anything else is an error naming the path and what is wrong, so a rendezvous socket can never
// sit where another user could connect to it or replace it. tagmem deletes only the socket
// files it created itself.
#pragma once

#include <string>

namespace tagmem::nccl {

// The checked directory (created if needed). Throws PEER with the reason.
std::string private_dir();

}  // namespace tagmem::nccl
