// state.cpp — the global lock, device configuration and device memory accounting.
//
// See Note [emu locking] in state.hpp. Device sizes come from the environment once, on first
// use; tagmem_emu_set_device_bytes (devices.cpp) may change them later.
#include "state.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <vector>

namespace tagmem::emu {
namespace {

struct device_state {
  uint64_t total = 0;
  uint64_t used = 0;
};

// Parses "8589934592", "8G", "8GiB", "512M"...; `fallback` when unset or malformed.
uint64_t parse_bytes(const char* text, uint64_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text) return fallback;
  uint64_t unit = 1;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case '\0':
      break;
    case 'K':
      unit = uint64_t{1} << 10;
      break;
    case 'M':
      unit = uint64_t{1} << 20;
      break;
    case 'G':
      unit = uint64_t{1} << 30;
      break;
    case 'T':
      unit = uint64_t{1} << 40;
      break;
    default:
      return fallback;
  }
  return value * unit;
}

int configured_device_count() {
  const char* text = std::getenv("TAGMEM_EMU_DEVICE_COUNT");
  if (text == nullptr || *text == '\0') return 2;
  return std::clamp(std::atoi(text), 0, max_devices);
}

struct globals {
  std::mutex mutex;
  std::vector<device_state> devices;
  uint64_t context_bytes = 0;
  live_objects live;

  globals() {
    const uint64_t bytes = parse_bytes(std::getenv("TAGMEM_EMU_DEVICE_BYTES"), uint64_t{8} << 30);
    devices.resize(configured_device_count(), device_state{bytes, 0});
    context_bytes = parse_bytes(std::getenv("TAGMEM_EMU_CONTEXT_BYTES"), 0);
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

uint64_t device_total(lock&, int device) { return g().devices[device].total; }
uint64_t device_used(lock&, int device) { return g().devices[device].used; }

bool charge(lock&, int device, uint64_t bytes) {
  device_state& d = g().devices[device];
  if (d.used > d.total || bytes > d.total - d.used) return false;
  d.used += bytes;
  return true;
}

void uncharge(lock&, int device, uint64_t bytes) {
  device_state& d = g().devices[device];
  d.used -= std::min(d.used, bytes);
}

void set_device_total(lock&, int device, uint64_t bytes) { g().devices[device].total = bytes; }

live_objects& live(lock&) { return g().live; }

}  // namespace tagmem::emu
