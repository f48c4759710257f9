// faults.cpp — call counters and armed faults; see Note [emu fault injection] in faults.hpp.
//
// Counting is two relaxed atomic increments per call (the entry point's and the total). Faults
// sit in a small list behind their own mutex, consulted only while at least one is armed, so an
// emulator without faults pays nothing more. A fault remembers the counter value at which it
// fires: the entry's own counter, or the total for a fault on any entry point.
#include "faults.hpp"

#include <signal.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "api.hpp"
#include "emu_control.h"
#include "option_table.hpp"

namespace tagmem::emu {
namespace {

constexpr int entry_count = static_cast<int>(entry::count_);

constexpr std::array<const char*, entry_count> entry_names = {
#define TAGMEM_DRIVER_ENTRY(name) #name,
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
};

struct fault {
  int entry;        // index into entry_names, or -1 for any entry point
  uint64_t target;  // the counter value whose call fails
  CUresult error;
};

// Index of `name` in entry_names; -1 for null; -2 when unknown.
int find_entry(const char* name) {
  if (name == nullptr) return -1;
  for (int i = 0; i < entry_count; ++i)
    if (std::strcmp(entry_names[i], name) == 0) return i;
  return -2;
}

struct fault_table {
  std::array<std::atomic<uint64_t>, entry_count> calls{};
  std::atomic<uint64_t> total{0};
  std::atomic<int> armed{0};
  std::mutex mutex;
  std::vector<fault> faults;
  // TAGMEM_EMU_KILL_AT=entry:n: the process dies (SIGKILL) at the nth call of `entry`, as a
  // process killed at that step would; tests of what the other processes of a job then see.
  int kill_entry = -3;
  uint64_t kill_at = 0;

  fault_table() {
    const char* at = std::getenv(tagmem::spec_of(tagmem::option::EMU_KILL_AT).name);
    if (!at || !*at) return;
    const std::string spec = at;
    const auto colon = spec.find(':');
    if (colon == std::string::npos) return;
    const int index = find_entry(spec.substr(0, colon).c_str());
    const uint64_t n = std::strtoull(spec.c_str() + colon + 1, nullptr, 10);
    if (index >= 0 && n > 0) {
      kill_entry = index;
      kill_at = n;
    }
  }
};

fault_table& table() {
  static fault_table* instance = new fault_table;  // leaked: see Note [emu locking]
  return *instance;
}

}  // namespace

CUresult on_call(entry e) {
  fault_table& t = table();
  const int index = static_cast<int>(e);
  const uint64_t own = t.calls[index].fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t any = t.total.fetch_add(1, std::memory_order_relaxed) + 1;
  if (index == t.kill_entry && own == t.kill_at) ::raise(SIGKILL);
  if (t.armed.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  std::lock_guard guard(t.mutex);
  for (auto it = t.faults.begin(); it != t.faults.end(); ++it) {
    if ((it->entry == index && it->target == own) || (it->entry == -1 && it->target == any)) {
      const CUresult error = it->error;
      t.faults.erase(it);
      t.armed.fetch_sub(1, std::memory_order_release);
      return error;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT int tagmem_emu_fail_call(const char* name, uint64_t nth, CUresult error) {
  const int index = find_entry(name);
  if (index == -2 || nth == 0 || error == CUDA_SUCCESS) return -1;
  fault_table& t = table();
  std::lock_guard guard(t.mutex);
  const uint64_t now = index == -1 ? t.total.load() : t.calls[index].load();
  t.faults.push_back(fault{index, now + nth, error});
  t.armed.fetch_add(1, std::memory_order_release);
  return 0;
}

TAGMEM_EMU_EXPORT void tagmem_emu_clear_faults(void) {
  fault_table& t = table();
  std::lock_guard guard(t.mutex);
  t.armed.fetch_sub(static_cast<int>(t.faults.size()), std::memory_order_release);
  t.faults.clear();
}

TAGMEM_EMU_EXPORT uint64_t tagmem_emu_call_count(const char* name) {
  const int index = find_entry(name);
  if (index == -2) return 0;
  return index == -1 ? table().total.load() : table().calls[index].load();
}
