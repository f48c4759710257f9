// record_moves.hpp — taking one recorded allocation off its addresses and putting it back.
//
// Pause releases in two phases (Note [two-phase release] in collective.cpp), with these moves:
//  detach   unmaps every mapping of the allocation but keeps a driver reference to its memory
//           (the one the shim holds for the application, or one borrowed for the occasion), so
//           no byte is lost yet; if an unmap fails, the mappings already undone are mapped back
//           with their access and the record is resident as before;
//  reattach maps the memory back at every recorded address with its recorded access;
//  finish   drops the reference, so the memory goes back to the driver once no process maps it,
//           and marks the record released.
// A reference the driver refuses to drop is kept as a leftover and dropped at the start of the
// next pause or resume: a failed cuMemRelease costs device memory for a while, never bytes, and
// never leaves a record half one thing and half another.
//
// All of this runs with the record table's mutex held and the allocation's device current.
#pragma once

#include <cuda.h>

#include "records.hpp"

namespace tagmem::nccl {

struct detached {
  allocation* a = nullptr;
  CUmemGenericAllocationHandle handle = 0;  // keeps the memory alive while unmapped
  bool borrowed = false;                    // retained for the detach (not a->real)
};

// Throws DRIVER naming the call; the record is then resident as before (unless mapping back
// failed too, which the message says).
detached detach(allocation& a);
// Throws DRIVER naming the address; the mappings made are undone, so `d` is still detached.
void reattach(const detached& d);
// Drops the reference (a leftover if the driver refuses) and marks the record released, its fds
// closed.
void finish_release(const detached& d);
// After reattach: gives back a borrowed reference (a leftover if the driver refuses).
void end_borrow(const detached& d);

// Maps `handle` at every recorded mapping of `a` with its recorded access. On failure unmaps
// what it mapped and throws DRIVER.
void map_everywhere(const allocation& a, CUmemGenericAllocationHandle handle);
// Drops a driver reference now, or later if the driver refuses (a leftover).
void release_or_keep(CUmemGenericAllocationHandle handle);
// Tries to drop every leftover reference; those refused stay for the next time.
void drop_leftovers() noexcept;

}  // namespace tagmem::nccl
