// control.cpp — the live-object counters of emu_control.h, read under the global lock.
#include "api.hpp"
#include "emu_control.h"

using namespace tagmem::emu;

namespace {

template <class Field>
uint64_t read(Field field) {
  lock held = take_lock();
  return live(held).*field;
}

}  // namespace

TAGMEM_EMU_EXPORT uint64_t tagmem_emu_pinned_host_bytes(void) {
  return read(&live_objects::pinned_bytes);
}
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_allocations(void) {
  return read(&live_objects::allocations);
}
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_mappings(void) { return read(&live_objects::mappings); }
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_reservations(void) {
  return read(&live_objects::reservations);
}
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_device_allocations(void) {
  return read(&live_objects::device_allocations);
}
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_streams(void) { return read(&live_objects::streams); }
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_events(void) { return read(&live_objects::events); }
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_host_allocations(void) {
  return read(&live_objects::host_allocations);
}
TAGMEM_EMU_EXPORT uint64_t tagmem_emu_live_host_registrations(void) {
  return read(&live_objects::host_registrations);
}
