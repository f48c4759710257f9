// state.cpp — the global lock, device configuration and device memory accounting.
//
// See Note [emu locking] in state.hpp. Device sizes come from the environment once, on first
// use (TAGMEM_EMU_*, options.def); tagmem_emu_set_device_bytes (devices.cpp) may change them later.
#include "state.hpp"

#include <algorithm>
#include <atomic>
#include <vector>

#include "option_table.hpp"
#include "shared_ledger.hpp"

namespace tagmem::emu {
namespace {

struct device_state {
  uint64_t total = 0;
  uint64_t used = 0;
};

// Read with libtagmem's rules (options.def): a bad value is reported and the default used.
uint64_t setting(option o) { return number_or_default(spec_of(o), "tagmem emu"); }

static_assert(spec_of(option::EMU_DEVICE_COUNT).high == max_devices);

struct globals {
  std::mutex mutex;
  std::vector<device_state> devices;
  uint64_t context_bytes = 0;
  live_objects live;
  bool shared = false;  // TAGMEM_EMU_SHARED_DEVICES: counted with other processes

  globals() {
    const uint64_t bytes = setting(option::EMU_DEVICE_BYTES);
    devices.resize(setting(option::EMU_DEVICE_COUNT), device_state{bytes, 0});
    context_bytes = setting(option::EMU_CONTEXT_BYTES);
    shared = ledger::enabled(static_cast<int>(devices.size()), bytes);
  }
};

globals& g() {
  static globals* instance = new globals;  // leaked: see Note [emu locking]
  return *instance;
}

std::atomic<bool> initialized_{false};

}  // namespace

lock take_lock() { return lock(g().mutex); }

bool initialized() { return initialized_.load(std::memory_order_acquire); }
void mark_initialized() { initialized_.store(true, std::memory_order_release); }

int device_count() { return static_cast<int>(g().devices.size()); }
bool valid_device(int device) { return device >= 0 && device < device_count(); }
uint64_t context_bytes() { return g().context_bytes; }

uint64_t device_total(lock&, int device) {
  return g().shared ? ledger::total(device) : g().devices[device].total;
}
uint64_t device_used(lock&, int device) {
  return g().shared ? ledger::used(device) : g().devices[device].used;
}

bool charge(lock&, int device, uint64_t bytes) {
  if (g().shared) return ledger::adjust_own(device, static_cast<int64_t>(bytes));
  device_state& d = g().devices[device];
  if (d.used > d.total || bytes > d.total - d.used) return false;
  d.used += bytes;
  return true;
}

void uncharge(lock&, int device, uint64_t bytes) {
  if (g().shared) {
    ledger::adjust_own(device, -static_cast<int64_t>(bytes));
    return;
  }
  device_state& d = g().devices[device];
  d.used -= std::min(d.used, bytes);
}

void set_device_total(lock&, int device, uint64_t bytes) {
  if (g().shared) ledger::set_total(device, bytes);
  g().devices[device].total = bytes;
}

bool charge_physical(lock& held, int device, uint64_t key, uint64_t bytes, bool imported) {
  if (g().shared) return ledger::hold(device, key, bytes, !imported);
  return imported || charge(held, device, bytes);
}

void uncharge_physical(lock& held, int device, uint64_t key, uint64_t bytes, bool imported) {
  if (g().shared) {
    ledger::drop(key);
  } else if (!imported) {
    uncharge(held, device, bytes);
  }
}

live_objects& live(lock&) { return g().live; }

}  // namespace tagmem::emu
