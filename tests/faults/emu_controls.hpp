// emu_controls.hpp — typed access to the emulated driver's control API, and leak censuses.
//
// The core, fault, fuzz and stress tests shape and inspect the emulated driver through
// emu_control.h: injected faults, call counts, device sizes and live-object counters. tagmem
// loads the driver with dlopen(TAGMEM_LIBCUDA), so these functions are found the same way, in the
// same library instance, and never linked: the stress test binary must also run against the real
// driver, where emu() reports the controls as absent instead of failing to load.
//
// A census is a snapshot of every live-object counter of the emulator. Two censuses taken around
// a workload that should leave nothing behind must be equal; describe_difference() names what
// differs, for the failure message.
#pragma once

#include <cstdint>
#include <string>

#include "emu_control.h"

namespace tagmem::reliability {

struct emu_controls {
  decltype(&tagmem_emu_device_count) device_count = nullptr;
  decltype(&tagmem_emu_set_device_bytes) set_device_bytes = nullptr;
  decltype(&tagmem_emu_device_bytes) device_bytes = nullptr;
  decltype(&tagmem_emu_device_used_bytes) device_used_bytes = nullptr;
  decltype(&tagmem_emu_pinned_host_bytes) pinned_host_bytes = nullptr;
  decltype(&tagmem_emu_live_allocations) live_allocations = nullptr;
  decltype(&tagmem_emu_live_mappings) live_mappings = nullptr;
  decltype(&tagmem_emu_live_reservations) live_reservations = nullptr;
  decltype(&tagmem_emu_live_device_allocations) live_device_allocations = nullptr;
  decltype(&tagmem_emu_live_streams) live_streams = nullptr;
  decltype(&tagmem_emu_live_events) live_events = nullptr;
  decltype(&tagmem_emu_live_host_allocations) live_host_allocations = nullptr;
  decltype(&tagmem_emu_live_host_registrations) live_host_registrations = nullptr;
  decltype(&tagmem_emu_fail_call) fail_call = nullptr;
  decltype(&tagmem_emu_clear_faults) clear_faults = nullptr;
  decltype(&tagmem_emu_call_count) call_count = nullptr;
  decltype(&tagmem_emu_set_copy_bytes_per_second) set_copy_bytes_per_second = nullptr;
  decltype(&tagmem_emu_hold_next_h2d_copy) hold_next_h2d_copy = nullptr;
  decltype(&tagmem_emu_release_held_copy) release_held_copy = nullptr;
  decltype(&tagmem_emu_hold_next_map) hold_next_map = nullptr;
  decltype(&tagmem_emu_release_held_map) release_held_map = nullptr;
  decltype(&tagmem_emu_hold_next_release) hold_next_release = nullptr;
  decltype(&tagmem_emu_release_held_release) release_held_release = nullptr;
  decltype(&tagmem_emu_sticky_error) sticky_error = nullptr;
  decltype(&tagmem_emu_clear_sticky_error) clear_sticky_error = nullptr;

  // Whether every control was found (TAGMEM_LIBCUDA names the emulated driver).
  bool available = false;
};

// The controls of the library TAGMEM_LIBCUDA names (loaded on first call, as tagmem loads it).
// All null and available == false when the variable is unset or names another library.
const emu_controls& emu();

// Every live-object counter of the emulator at one moment.
struct emu_census {
  std::uint64_t device_used[2] = {0, 0};  // bytes, devices 0 and 1
  std::uint64_t pinned_host_bytes = 0;
  std::uint64_t allocations = 0;
  std::uint64_t mappings = 0;
  std::uint64_t reservations = 0;
  std::uint64_t device_allocations = 0;
  std::uint64_t streams = 0;
  std::uint64_t events = 0;
  std::uint64_t host_allocations = 0;
  std::uint64_t host_registrations = 0;

  bool operator==(const emu_census&) const = default;
};

emu_census take_census();

// "mappings 3 -> 5, pinned_host_bytes 0 -> 2097152" for the counters that differ; "" if none.
std::string describe_difference(const emu_census& before, const emu_census& after);

}  // namespace tagmem::reliability
