// physical.hpp — physical allocations (cuMemCreate, import) and their generic handles.
//
// A physical allocation is a memfd of its size. Its life follows the real driver's rule: the
// memory exists while a handle reference (create, import, cuMemRetainAllocationHandle) is
// unreleased or a mapping remains; when both are gone the memfd is closed and, with no mapping
// left, its pages go back to the OS. A device-located allocation counts against its device for
// exactly that life. Shareable POSIX fds given out by export are dups of the memfd and keep the
// pages alive on their own, like the real driver's shareable handles.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>

#include "state.hpp"

namespace tagmem::emu {

struct physical {
  int fd = -1;  // the memfd
  size_t size = 0;
  CUmemAllocationProp prop{};  // as cuMemGetAllocationPropertiesFromHandle reports it
  bool exportable = false;     // may be exported as a POSIX fd
  int charged_device = -1;     // device whose bytes it uses; -1 for host-located
  bool imported = false;
  uint64_t key = 0;  // the memfd's inode: the same allocation in every process
  CUmemGenericAllocationHandle handle = 0;
  int handle_refs = 0;  // unreleased references to `handle`
  int mappings = 0;     // live cuMemMap mappings
};

// The allocation behind an unreleased handle, or null.
std::shared_ptr<physical> find_handle(lock&, CUmemGenericAllocationHandle handle);
void retain_handle(lock&, physical& memory);
void add_mapping(lock&, physical& memory);
// Drops one mapping; frees the allocation when nothing refers to it any more.
void remove_mapping(lock&, physical& memory);

}  // namespace tagmem::emu
