// resume_steps.hpp — the steps of the NCCL resume, in the order collective.cpp runs them: rebuild
// and refill the released buffers created here (or undo that everywhere when a rank failed),
// commit them to the records, and re-share them with the processes that import them. Each works
// on the records with the record table's mutex held; the protocol is in collective.cpp.
#pragma once

#include <cuda.h>

#include <vector>

#include "api/runtime.hpp"
#include "collective_state.hpp"

namespace tagmem::nccl::detail {

// A released record of this process, rebuilt on new memory but not yet committed.
struct rebuilt {
  allocation* a;
  CUmemGenericAllocationHandle handle;
  bool mapped;  // at every recorded mapping of a
};

// Resume step 1 for this rank: rebuilds and refills; on failure undoes everything it did.
std::vector<rebuilt> rebuild_local(const runtime::hold& rt, int timeout_ms);

// Undoes the rebuilds in `done` (unmaps and releases them; their backups stay) and clears it.
void undo(const runtime::hold& rt, std::vector<rebuilt>& done);

// Once every rank has rebuilt: makes the records of `done` resident on their new memory, the
// shim holding the handle while NCCL holds its own, and gives back their backups.
void commit(std::vector<rebuilt>& done);

// Resume step 2: re-share. An owner hands a new handle only to a process it exported the
// buffer to, an importer takes one only from the process it imported from; a mismatch fails
// the resume naming both sides, and nothing is mapped for it.
void reshare(const runtime::hold& rt, group_session& s);

}  // namespace tagmem::nccl::detail
