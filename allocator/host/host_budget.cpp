// host_budget.cpp — reads MemAvailable and the memory cgroup limits (Note [host budget]).
#include "host/host_budget.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace tagmem {
namespace {

constexpr std::size_t kUnbounded = static_cast<std::size_t>(-1);
constexpr std::size_t kMinMargin = 64ull << 20;

bool read_text(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

// A whole decimal number; false for anything else.
bool parse_count(const std::string& text, std::size_t* out) {
  std::string t = text.substr(0, text.find_first_of(" \n"));
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  unsigned long long v = std::strtoull(t.c_str(), nullptr, 10);
  if (errno) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

// A cgroup limit: a whole decimal number, or "max" (no limit).
bool parse_limit(const std::string& text, std::size_t* out) {
  if (text.substr(0, text.find_first_of(" \n")) != "max") return parse_count(text, out);
  *out = kUnbounded;
  return true;
}

// The values of `keys` in a "key value" per line file (memory.stat); 0 for a key not there.
template <std::size_t N>
std::array<std::size_t, N> stat_values(const std::string& path,
                                       const std::array<const char*, N>& keys) {
  std::array<std::size_t, N> out{};
  std::ifstream in(path);
  std::string k;
  std::size_t v = 0;
  while (in >> k >> v) {
    for (std::size_t i = 0; i < N; ++i) {
      if (keys[i] && k == keys[i]) out[i] = v;
    }
  }
  return out;
}

// What the kernel's MemAvailable (si_mem_available) counts as reclaimable in `pages` bytes of
// file cache or reclaimable slab: all of it but the share of the low watermark it would keep,
// at most half.
std::size_t reclaimable(std::size_t pages, std::size_t low_share) {
  return pages - std::min(pages / 2, low_share);
}

// A cgroup's share of the machine's low watermark: in proportion to its limit (the whole of it
// when MemTotal is unknown or the limit exceeds it).
std::size_t low_share(std::size_t low_watermark, std::size_t limit, std::size_t mem_total) {
  if (mem_total == kUnbounded || mem_total == 0 || limit >= mem_total) return low_watermark;
  return static_cast<std::size_t>(static_cast<unsigned __int128>(low_watermark) * limit /
                                  mem_total);
}

// The sum of every zone's low watermark ("low <pages>" in /proc/zoneinfo), in bytes; 0 when it
// cannot be read (the reclaimable memory is then not reduced by it).
std::size_t read_low_watermark(const std::string& path) {
  std::ifstream in(path);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::size_t pages = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string key;
    unsigned long long n = 0;
    if (f >> key >> n && key == "low") pages += static_cast<std::size_t>(n);
  }
  return pages > kUnbounded / page ? kUnbounded : pages * page;
}

// Mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct mount {
  std::string root;   // the hierarchy's directory mounted there
  std::string point;  // where it is mounted
};

// The first mount of `fstype` whose super options include `option` (any when empty).
bool find_mount(const std::string& mountinfo, const char* fstype, const char* option, mount* out) {
  std::istringstream lines(mountinfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::vector<std::string> fields;
    for (std::string w; f >> w;) fields.push_back(w);
    auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    if (dash[1] != fstype) continue;
    if (*option) {
      std::string opts = "," + dash[3] + ",";
      if (opts.find(std::string(",") + option + ",") == std::string::npos) continue;
    }
    *out = {unescape(fields[3]), unescape(fields[4])};
    return true;
  }
  return false;
}

// The process's path in the hierarchy named by a /proc/self/cgroup line: "0::" for v2, a
// controller name ("memory") for v1.
bool cgroup_path(const std::string& self_cgroup, const char* controller, std::string* out) {
  std::istringstream lines(self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    bool match = *controller
                     ? ("," + controllers + ",").find(std::string(",") + controller + ",") !=
                           std::string::npos
                     : line.compare(0, b, "0:") == 0;
    if (match) {
      *out = line.substr(b + 1);
      return true;
    }
  }
  return false;
}

struct cgroup_files {
  const char* label;  // "cgroup v2"
  const char* limit;
  const char* usage;
  // memory.stat's keys of the file pages on the active and inactive lists and of reclaimable slab
  // (nullptr: the version has none).
  std::array<const char*, 3> reclaimable_keys;
};

// Takes the free memory of every level from the process's cgroup up to the mount into `m`.
// `low_watermark` is the machine's, in bytes; each level's share of it is in proportion to its
// limit. Returns whether any level had a limit.
bool walk(const mount& mnt, std::string path, const cgroup_files& files, std::size_t low_watermark,
          std::size_t mem_total, host_memory& m) {
  if (mnt.root != "/" && path.compare(0, mnt.root.size(), mnt.root) == 0) {
    path = path.substr(mnt.root.size());
  } else if (mnt.root != "/") {
    path.clear();  // outside what is mounted: the mounted cgroup is the nearest one known
  }
  std::string dir = mnt.point + path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  bool limited = false;
  for (;;) {
    std::string limit_text, usage_text;
    std::size_t limit = 0, usage = 0;
    if (read_text(dir + "/" + files.limit, &limit_text) &&
        read_text(dir + "/" + files.usage, &usage_text) && parse_limit(limit_text, &limit) &&
        parse_count(usage_text, &usage) && limit != kUnbounded) {
      limited = true;
      const auto [active, inactive, slab] =
          stat_values(dir + "/memory.stat", files.reclaimable_keys);
      const std::size_t share = low_share(low_watermark, limit, mem_total);
      const std::size_t file = active + std::min(inactive, kUnbounded - active);
      const std::size_t from_file = std::min(usage, reclaimable(file, share));
      const std::size_t can_reclaim =
          from_file + std::min(usage - from_file, reclaimable(slab, share));
      const std::size_t used = usage - can_reclaim;
      const std::size_t free = limit - std::min(limit, used);
      if (free < m.available) {
        m.available = free;
        m.limited_by = std::string(files.label) + " " + dir;
      }
      m.total = std::min(m.total, limit);
    }
    if (dir.size() <= mnt.point.size()) break;
    auto slash = dir.find_last_of('/');
    if (slash == std::string::npos || slash < mnt.point.size()) break;
    dir.resize(std::max(slash, mnt.point.size()));
  }
  return limited;
}

// MemTotal and MemAvailable from meminfo, in bytes.
void read_meminfo(const std::string& path, host_memory& m) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string key;
    unsigned long long kib = 0;
    if (!(f >> key >> kib)) continue;
    std::size_t bytes = static_cast<std::size_t>(kib) << 10;
    if (key == "MemTotal:") m.total = std::min(m.total, bytes);
    if (key == "MemAvailable:" && bytes < m.available) {
      m.available = bytes;
      m.limited_by = "MemAvailable";
    }
  }
}

}  // namespace

host_memory read_host_memory(const host_memory_files& files) {
  host_memory m;
  read_meminfo(files.meminfo, m);
  const std::size_t mem_total = m.total;
  std::string self, mountinfo, path;
  if (!read_text(files.self_cgroup, &self) || !read_text(files.mountinfo, &mountinfo)) return m;
  const std::size_t low = read_low_watermark(files.zoneinfo);
  mount mnt;
  if (find_mount(mountinfo, "cgroup2", "", &mnt) && cgroup_path(self, "", &path) &&
      walk(mnt, path,
           {"cgroup v2",
            "memory.max",
            "memory.current",
            {"active_file", "inactive_file", "slab_reclaimable"}},
           low, mem_total, m)) {
    return m;
  }
  if (find_mount(mountinfo, "cgroup", "memory", &mnt) && cgroup_path(self, "memory", &path)) {
    // v1's memory.stat has no slab; its total_* figures count the hierarchy below each level.
    walk(mnt, path,
         {"cgroup v1",
          "memory.limit_in_bytes",
          "memory.usage_in_bytes",
          {"total_active_file", "total_inactive_file", nullptr}},
         low, mem_total, m);
  }
  return m;
}

std::size_t host_margin(std::size_t total) noexcept { return std::max(kMinMargin, total / 32); }

std::size_t host_headroom(const host_memory& m) noexcept {
  if (m.available == kUnbounded) return kUnbounded;
  std::size_t margin = host_margin(m.total);
  return m.available > margin ? m.available - margin : 0;
}

}  // namespace tagmem
