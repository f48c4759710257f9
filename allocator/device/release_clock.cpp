// release_clock.cpp — see Note [release aftermath] in release_clock.hpp.
#include "device/release_clock.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "device/clock_page.hpp"
#include "device/received_fds.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "options/options.hpp"

namespace tagmem::release_clock {
namespace {

using clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
      .count();
}

// The end of the time owed, in a page of /dev/shm that every process of this user shares (so
// that a trainer sees the release its engine process just made), or in this process alone where
// that page is refused (Note [clock page]) or the driver is an emulated one.
struct clock_state {
  std::mutex mu;  // read, add, write back: one at a time in this process
  std::optional<clock_page> page;
  std::int64_t local = 0;  // where there is no page
};

clock_state& state() noexcept {
  static clock_state s;
  return s;
}

// Whether the devices are the machine's: an emulated driver's devices belong to its process.
bool real_driver() noexcept {
  const char* lib = option_env(option::LIBCUDA);
  if (lib == nullptr) return true;
  const char* name = std::strrchr(lib, '/');
  return std::strncmp(name ? name + 1 : lib, "libcuda.so", 10) == 0;
}

// The page at `path` for `s`. Holds s.mu. A refusal is said once per attempt: always when
// something holds the name (another user's plant, or damage), at TAGMEM_LOG=info when the page
// could not be made at all (no /dev/shm in a container, say).
bool attach(clock_state& s, const std::string& path) noexcept {
  std::string why;
  s.page = clock_page::open(path, why);
  if (s.page) return true;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 || logging(log_level::info)) {
    log_line("release clock not shared: " + path + ": " + why);
  }
  return false;
}

clock_state& shared_state() noexcept {
  static clock_state& s = []() -> clock_state& {
    clock_state& st = state();
    if (real_driver()) {
      std::lock_guard<std::mutex> lock(st.mu);
      attach(st, "/dev/shm/tagmem-release-clock-" + std::to_string(geteuid()));
    }
    return st;
  }();
  return s;
}

std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t out = 0;
  if (!__builtin_add_overflow(a, b, &out)) return out;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

// The end of the time owed as stored, clamped to [0, now + longest]: another process, or a torn
// read, may have left any value there. Holds s.mu.
std::int64_t load_until(const clock_state& s, std::int64_t now) noexcept {
  std::int64_t v = s.local;
  if (s.page) v = s.page->read().value_or(0);
  const std::int64_t cap = saturating_add(now, std::chrono::nanoseconds(longest).count());
  return std::clamp<std::int64_t>(v, 0, cap);
}

void store_until(clock_state& s, std::int64_t v) noexcept {
  if (s.page)
    s.page->write(v);
  else
    s.local = v;
}

std::atomic<std::uint64_t> noted{0};  // bytes_noted()

}  // namespace

CUresult release(CUmemGenericAllocationHandle handle, std::size_t bytes) noexcept {
  const CUresult r = received_fds::release_handle(handle);
  if (r == CUDA_SUCCESS) note(bytes);
  return r;
}

void note(std::size_t bytes) noexcept {
  using std::chrono::nanoseconds;
  noted.fetch_add(bytes, std::memory_order_relaxed);
  // In MiB first: bytes * ns would overflow for the largest releases.
  const std::int64_t owed =
      static_cast<std::int64_t>(bytes >> 20) * nanoseconds(time_per_gib).count() / 1024;
  if (owed <= 0) return;
  const std::int64_t now = now_ns();
  const std::int64_t cap = saturating_add(now, nanoseconds(longest).count());
  clock_state& s = shared_state();
  std::lock_guard<std::mutex> lock(s.mu);
  // Two processes adding at one instant may count one release, not both: the clock is a hint.
  store_until(s, std::min(saturating_add(std::max(load_until(s, now), now), owed), cap));
}

std::chrono::nanoseconds owed() noexcept {
  const std::int64_t now = now_ns();
  clock_state& s = shared_state();
  std::lock_guard<std::mutex> lock(s.mu);
  return std::chrono::nanoseconds(std::max<std::int64_t>(0, load_until(s, now) - now));
}

bool after_release() noexcept { return owed() > least; }

std::uint64_t bytes_noted() noexcept { return noted.load(std::memory_order_relaxed); }

void reset() noexcept {
  clock_state& s = shared_state();
  std::lock_guard<std::mutex> lock(s.mu);
  store_until(s, 0);
}

bool share_through(const std::string& path) noexcept {
  clock_state& s = shared_state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.page.reset();
  if (path.empty()) return false;
  return attach(s, path);
}

}  // namespace tagmem::release_clock
