// fd_identity.hpp — whether two file descriptors of this process refer to one open file.
//
// A POSIX-fd shareable handle that NCCL passes to a peer over a Unix socket arrives there as a
// new descriptor of the same open file description. The shim keeps a duplicate of every fd an
// allocation exports and of every fd a peer imports, so once the exporter's duplicates have been
// passed to the importer (during a pause) the importer can tell which allocation each of its
// imports is, by comparing descriptions within its own process: kcmp(KCMP_FILE) when the kernel
// allows it, else by flipping O_APPEND on one descriptor and looking for the flip on the other
// (file status flags belong to the description; the flag is restored at once, and O_APPEND
// changes nothing for memory handles, which are never written with write()). Descriptors of
// different files (st_dev/st_ino) are told apart without either.
#pragma once

namespace tagmem::peers {

bool same_open_file(int a, int b);

}  // namespace tagmem::peers
