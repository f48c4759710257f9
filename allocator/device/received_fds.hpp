// received_fds.hpp — the shareable handle (a POSIX fd) each imported handle came with, kept so
// that the memory can be handed on.
//
// Note [one hop]: the driver does not export a handle this process imported
// (cuMemExportToShareableHandle returns CUDA_ERROR_INVALID_VALUE for it; measured on an H200,
// driver 580), so without more, memory a process received could only go back to the driver when
// that process offloads it: a trainer/engine cycle would hand each piece once and then create it
// anew. The descriptor the handle arrived with refers to the same memory, so the taker keeps it
// beside the handle (keep) and a giver sends a copy of it where the export is refused
// (shareable_fd, for handoff and tagged-memory IPC alike);
// the memory then goes on to the next taker, back to its creator too. The descriptor keeps the
// memory alive on its own, so it must be closed when the handle goes back to the driver: every
// release of a tag's handle goes through release_handle, which closes it (forget). One book for
// the process; handles are unique within it. The mutex is a leaf.
#pragma once

#include <cuda.h>

namespace tagmem::received_fds {

// Keeps `fd` (owned from now on) for `handle`; false, with `fd` still the caller's, when no
// record can be made.
bool keep(CUmemGenericAllocationHandle handle, int fd) noexcept;
// A POSIX-fd shareable handle for the memory of `handle` (the caller closes it): exported, else a
// copy of the descriptor kept for it; -1 when neither works, with the export's error in `why`.
int shareable_fd(CUmemGenericAllocationHandle handle, CUresult* why = nullptr) noexcept;
// Closes the descriptor kept for `handle`, if any.
void forget(CUmemGenericAllocationHandle handle) noexcept;
// cuMemRelease of `handle`, and forget when it succeeds.
CUresult release_handle(CUmemGenericAllocationHandle handle) noexcept;

}  // namespace tagmem::received_fds
