// host_budget.hpp — how much host memory the pinned host store may still pin.
//
// Note [host budget]: pinning faults in and locks every page (Note [pinning method]). A process
// that pins more than its memory cgroup or the machine has left is not refused anything: the
// kernel's out-of-memory killer ends it with SIGKILL, with no error to report and every backup
// lost. So the store asks before it touches a page, and a growth that does not fit fails with
// HOST_OUT_OF_MEMORY instead. The store's budget, re-read at every growth (memory use changes):
//
//   budget   = min(TAGMEM_HOST_MAX_BYTES if set, pinned + headroom)
//   headroom = min(MemAvailable, free in each memory cgroup from the process's own up to the
//              root of its hierarchy) - margin, at least 0
//   free in a cgroup = limit - (usage - reclaimable)
//   reclaimable = file - min(file / 2, low) + slab - min(slab / 2, low), at most usage
//              file: its file pages, active and inactive; slab: its reclaimable slab;
//              low: the machine's low watermark (the sum of /proc/zoneinfo's "low" over
//              zones) times limit / MemTotal
//              cgroup v2: memory.max, memory.current; active_file, inactive_file and
//              slab_reclaimable of memory.stat;
//              cgroup v1 (only where no v2 level has a limit): memory.limit_in_bytes,
//              memory.usage_in_bytes; total_active_file and total_inactive_file of
//              memory.stat (v1 reports no slab)
//   margin   = max(64 MiB, total / 32), total = min(MemTotal, the tightest cgroup limit)
//
// Reclaimable is the kernel's own estimate, the formula of MemAvailable (si_mem_available) for
// one cgroup: the kernel reclaims file pages, active ones included (a checkpoint read twice is
// all active), and reclaimable slab before its out-of-memory killer ends anyone in the cgroup,
// keeping back about its low watermark. The margin leaves room for the rest of the process (its
// stacks, the driver, Python) to grow after the store did. A source that cannot be read limits
// nothing; with none readable only TAGMEM_HOST_MAX_BYTES does.
#pragma once

#include <cstddef>
#include <string>

namespace tagmem {

// Where the figures come from: the real /proc files, or a test's fakes (mount points in the fake
// mountinfo then name the fake cgroup directories).
struct host_memory_files {
  std::string self_cgroup = "/proc/self/cgroup";
  std::string mountinfo = "/proc/self/mountinfo";
  std::string meminfo = "/proc/meminfo";
  std::string zoneinfo = "/proc/zoneinfo";
};

struct host_memory {
  std::size_t available = static_cast<std::size_t>(-1);  // what may still be used, no margin
  std::size_t total = static_cast<std::size_t>(-1);      // MemTotal or the tightest limit
  std::string limited_by;  // "MemAvailable", "cgroup v2 <dir>", ... ("" when nothing was read)
};

// Reads the figures of Note [host budget]. Never throws for a missing or malformed file (that
// source is left out); may throw std::bad_alloc.
host_memory read_host_memory(const host_memory_files& files = {});

// The margin of Note [host budget] for a machine or cgroup of `total` bytes.
std::size_t host_margin(std::size_t total) noexcept;

// available - margin, at least 0 (unbounded when nothing was read).
std::size_t host_headroom(const host_memory& m) noexcept;

}  // namespace tagmem
