// emu_controls.cpp — finds the emulator's control functions with dlsym (see emu_controls.hpp).
#include "emu_controls.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

namespace tagmem::reliability {
namespace {

template <class F>
bool find(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  return out != nullptr;
}

emu_controls load_controls() {
  emu_controls c;
  const char* path = std::getenv("TAGMEM_LIBCUDA");
  if (path == nullptr || *path == '\0') return c;
  // The same flags as tagmem's own dlopen (allocator/driver/driver.cpp): one instance.
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return c;
  bool all = true;
  all &= find(h, "tagmem_emu_device_count", c.device_count);
  all &= find(h, "tagmem_emu_set_device_bytes", c.set_device_bytes);
  all &= find(h, "tagmem_emu_device_bytes", c.device_bytes);
  all &= find(h, "tagmem_emu_device_used_bytes", c.device_used_bytes);
  all &= find(h, "tagmem_emu_pinned_host_bytes", c.pinned_host_bytes);
  all &= find(h, "tagmem_emu_live_allocations", c.live_allocations);
  all &= find(h, "tagmem_emu_live_mappings", c.live_mappings);
  all &= find(h, "tagmem_emu_live_reservations", c.live_reservations);
  all &= find(h, "tagmem_emu_live_device_allocations", c.live_device_allocations);
  all &= find(h, "tagmem_emu_live_streams", c.live_streams);
  all &= find(h, "tagmem_emu_live_events", c.live_events);
  all &= find(h, "tagmem_emu_live_host_allocations", c.live_host_allocations);
  all &= find(h, "tagmem_emu_live_host_registrations", c.live_host_registrations);
  all &= find(h, "tagmem_emu_fail_call", c.fail_call);
  all &= find(h, "tagmem_emu_clear_faults", c.clear_faults);
  all &= find(h, "tagmem_emu_call_count", c.call_count);
  all &= find(h, "tagmem_emu_set_copy_bytes_per_second", c.set_copy_bytes_per_second);
  all &= find(h, "tagmem_emu_hold_next_h2d_copy", c.hold_next_h2d_copy);
  all &= find(h, "tagmem_emu_release_held_copy", c.release_held_copy);
  all &= find(h, "tagmem_emu_hold_next_map", c.hold_next_map);
  all &= find(h, "tagmem_emu_release_held_map", c.release_held_map);
  all &= find(h, "tagmem_emu_hold_next_release", c.hold_next_release);
  all &= find(h, "tagmem_emu_release_held_release", c.release_held_release);
  all &= find(h, "tagmem_emu_sticky_error", c.sticky_error);
  all &= find(h, "tagmem_emu_clear_sticky_error", c.clear_sticky_error);
  c.available = all;
  return c;
}

}  // namespace

const emu_controls& emu() {
  static const emu_controls controls = load_controls();
  return controls;
}

emu_census take_census() {
  const emu_controls& c = emu();
  emu_census s;
  if (!c.available) return s;
  for (int d = 0; d < 2 && d < c.device_count(); ++d) s.device_used[d] = c.device_used_bytes(d);
  s.pinned_host_bytes = c.pinned_host_bytes();
  s.allocations = c.live_allocations();
  s.mappings = c.live_mappings();
  s.reservations = c.live_reservations();
  s.device_allocations = c.live_device_allocations();
  s.streams = c.live_streams();
  s.events = c.live_events();
  s.host_allocations = c.live_host_allocations();
  s.host_registrations = c.live_host_registrations();
  return s;
}

std::string describe_difference(const emu_census& before, const emu_census& after) {
  std::string out;
  auto field = [&](const char* name, std::uint64_t a, std::uint64_t b) {
    if (a == b) return;
    if (!out.empty()) out += ", ";
    out += std::string(name) + " " + std::to_string(a) + " -> " + std::to_string(b);
  };
  field("device0_used_bytes", before.device_used[0], after.device_used[0]);
  field("device1_used_bytes", before.device_used[1], after.device_used[1]);
  field("pinned_host_bytes", before.pinned_host_bytes, after.pinned_host_bytes);
  field("allocations", before.allocations, after.allocations);
  field("mappings", before.mappings, after.mappings);
  field("reservations", before.reservations, after.reservations);
  field("device_allocations", before.device_allocations, after.device_allocations);
  field("streams", before.streams, after.streams);
  field("events", before.events, after.events);
  field("host_allocations", before.host_allocations, after.host_allocations);
  field("host_registrations", before.host_registrations, after.host_registrations);
  return out;
}

}  // namespace tagmem::reliability
