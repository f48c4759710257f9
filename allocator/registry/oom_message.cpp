// oom_message.cpp — explaining an out-of-memory error (see oom_message.hpp).
#include "registry/oom_message.hpp"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "observe/log.hpp"

namespace tagmem {
namespace {

constexpr std::size_t kLargestShown = 3;

tagmem_tag_stats stats_of(tag& t) {
  std::lock_guard lock(t.mutex());
  return t.stats();
}

}  // namespace

std::string explain_out_of_memory_message(registry& r, int device, const char* what,
                                          const char* const* names, std::size_t count,
                                          std::size_t asked, const error& e) {
  std::string msg;
  try {
    std::string failing, stays;
    std::size_t needed = 0;
    for (std::size_t i = 0; i < count; ++i) {
      tag* t = r.find(device, names[i]);
      if (!t) continue;
      const tagmem_tag_stats s = stats_of(*t);
      if (asked == 0 && s.state == TAGMEM_RESIDENT) continue;  // this one came back
      needed += asked ? asked : s.reserved_bytes;
      failing += std::string(failing.empty() ? "" : ", ") + "'" + t->name() + "'";
      if (s.state == TAGMEM_OFFLOADED_BACKUP || s.state == TAGMEM_OFFLOADED_DISK) {
        stays += std::string(stays.empty() ? "" : "; ") + "'" + t->name() +
                 "' stays offloaded with its backup";
      } else if (s.state == TAGMEM_OFFLOADED_DISCARD) {
        stays += std::string(stays.empty() ? "" : "; ") + "'" + t->name() +
                 "' stays offloaded (DISCARD: no backup to lose)";
      }
    }
    std::vector<std::pair<std::size_t, std::string>> resident;
    for (tag* t : r.tags(device)) {
      const tagmem_tag_stats s = stats_of(*t);
      if (s.mapped_bytes) resident.emplace_back(s.mapped_bytes, t->name());
    }
    std::sort(resident.begin(), resident.end(), std::greater<>());
    std::size_t free_bytes = 0, total_bytes = 0;
    r.dev(device).memory_info(&free_bytes, &total_bytes);

    msg = std::string(what) + " tag " + (failing.empty() ? "(none)" : failing) + " needs " +
          std::to_string(needed) + " bytes of device memory; device " + std::to_string(device) +
          " has " + std::to_string(free_bytes) + " of " + std::to_string(total_bytes) +
          " bytes free; largest resident tags:";
    if (resident.empty()) msg += " none";
    for (std::size_t i = 0; i < resident.size() && i < kLargestShown; ++i) {
      msg += std::string(i ? "," : "") + " '" + resident[i].second + "' " +
             std::to_string(resident[i].first) + " bytes";
    }
    if (!stays.empty()) msg += "; " + stays;
    msg += std::string(" (") + e.what() + ")";
  } catch (...) {  // describing failed (the driver, memory): the original message stands
    return e.what();
  }
  if (logging(log_level::info)) log_line("out of memory: " + msg);
  return msg;
}

}  // namespace tagmem
