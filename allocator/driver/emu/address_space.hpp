// address_space.hpp — the emulated device address space: reservations and the regions in them.
//
// A reservation is an anonymous PROT_NONE mapping (cuMemAddressReserve). A region is a range the
// device may touch: either a cuMemMap mapping of a physical allocation inside a reservation,
// with per-device read/write access set by cuMemSetAccess, or a cuMemAlloc block, which every
// device may read and write. Copies and memsets check their device ranges against the regions
// (accessible) and, while they move bytes, pin them.
//
// Note [emu pins]: the real driver lets cuMemUnmap proceed under a copy that is still running
// (the copy then faults). The emulator copies in pieces of at most `copy_piece` bytes and pins
// the regions a piece touches while it is moved; anything that takes access away (unmap,
// cuMemSetAccess, cuMemFree, cuMemAddressFree) first waits for the pins in its range to go. So an
// unmap under a running copy lets the piece in flight finish, the next piece finds the range gone
// and the stream faults (Note [emu sticky errors]) — the bug shows, and the emulator never
// touches memory that has been unmapped underneath it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "state.hpp"

namespace tagmem::emu {

struct physical;

inline constexpr size_t copy_piece = size_t{8} << 20;
inline constexpr uint64_t all_devices = ~uint64_t{0};

enum class region_kind { mapping, device_allocation };

struct region {
  uintptr_t base = 0;
  size_t size = 0;
  region_kind kind = region_kind::mapping;
  std::shared_ptr<physical> memory;  // the mapped allocation (mappings only)
  uint64_t readers = 0;              // devices that may read, one bit each
  uint64_t writers = 0;              // devices that may write
  unsigned host_access = 0;          // CU_MEM_ACCESS_FLAGS_* of the CPU (host-located memory)
  int pins = 0;                      // pieces of copies moving bytes in it now
};

// ---- reservations ------------------------------------------------------------------------
void add_reservation(lock&, uintptr_t base, size_t size);
// The size of the reservation starting exactly at `base`, 0 if none.
size_t reservation_at(lock&, uintptr_t base);
void remove_reservation(lock&, uintptr_t base);
// Whether [base, base+size) lies inside a single reservation.
bool inside_one_reservation(lock&, uintptr_t base, size_t size);

// ---- regions -----------------------------------------------------------------------------
region& add_region(lock&, region r);
void remove_region(lock&, uintptr_t base);
// The region containing `addr`, or null.
region* region_at(lock&, uintptr_t addr);
bool any_region_in(lock&, uintptr_t base, size_t size);
// Mappings that exactly tile [base, base+size), in address order; empty when the range does not
// start and end on mapping boundaries, has a gap, or touches a device allocation.
std::vector<region*> whole_mappings(lock&, uintptr_t base, size_t size);

// ---- copies ------------------------------------------------------------------------------
// Whether `device` may read (or write) every byte of [addr, addr+size).
bool accessible(lock&, uintptr_t addr, size_t size, int device, bool write);
// Like accessible, and pins the regions on success; see Note [emu pins].
bool pin(lock&, uintptr_t addr, size_t size, int device, bool write);
void unpin(lock&, uintptr_t addr, size_t size);
// Waits (releasing the lock meanwhile) until no region in [base, base+size) is pinned. The
// caller re-validates afterwards: the address space may have changed while it waited.
void wait_unpinned(lock&, uintptr_t base, size_t size);
bool any_pinned(lock&, uintptr_t base, size_t size);

}  // namespace tagmem::emu
