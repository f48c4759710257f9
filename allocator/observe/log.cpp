// log.cpp — the TAGMEM_LOG level and line output (see log.hpp and log_stamp.hpp).
#include "observe/log.hpp"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "observe/log_stamp.hpp"
#include "observe/trace.hpp"
#include "options/options.hpp"

namespace tagmem {
namespace {

constexpr int kUnread = -1;
std::atomic<int> g_level{kUnread};
std::mutex g_sink_mutex;
std::function<void(const std::string&)> g_sink;  // guarded by g_sink_mutex
std::atomic<int> g_rank{-1};

int read_level() noexcept {
  try {
    return option_choice(option::LOG);  // the index in "off|info|debug" is the level
  } catch (...) {
    return 0;
  }
}

// The rank a launcher gave this process on its node (torchrun's LOCAL_RANK, which NCCL groups
// take as their rank too, peers/group.hpp), or -1 when there is none or it is no number.
int launcher_rank() noexcept {
  const char* v = std::getenv("LOCAL_RANK");
  if (v == nullptr || *v < '0' || *v > '9') return -1;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  return *end == '\0' && r <= 1 << 20 ? static_cast<int>(r) : -1;
}

}  // namespace

log_level current_log_level() noexcept {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kUnread) {
    level = read_level();
    g_level.store(level, std::memory_order_relaxed);
  }
  return static_cast<log_level>(level);
}

void log_line(const std::string& line) noexcept {
  try {
    const std::string text = "tagmem: " + log_stamp() + " " + line + "\n";
    {
      std::lock_guard lock(g_sink_mutex);
      if (g_sink) {
        g_sink(text);
        return;
      }
    }
    // One write: lines of several threads stay whole.
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  } catch (...) {  // no memory for the line: it is lost, the operation is not
  }
}

std::string log_stamp() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  char buf[96];
  int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ pid=%ld",
                        utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                        utc.tm_sec, now.tv_nsec / 1000000, static_cast<long>(::getpid()));
  int rank = g_rank.load(std::memory_order_relaxed);
  if (rank < 0) rank = launcher_rank();
  if (rank >= 0 && n > 0 && static_cast<std::size_t>(n) < sizeof buf) {
    std::snprintf(buf + n, sizeof buf - n, " rank=%d", rank);
  }
  return buf;
}

void set_log_rank(int rank) noexcept { g_rank.store(rank < 0 ? -1 : rank); }

void configure_observation() noexcept {
  g_level.store(read_level());
  trace::configure();
}

void set_log_sink_for_testing(std::function<void(const std::string&)> sink) {
  std::lock_guard lock(g_sink_mutex);
  g_sink = std::move(sink);
}

std::string format_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", ms);
  return buf;
}

std::string format_gbps(double bytes, double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ms > 0 ? bytes / 1e9 / (ms / 1e3) : 0.0);
  return buf;
}

std::string format_address(std::uint64_t address) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(address));
  return buf;
}

}  // namespace tagmem
