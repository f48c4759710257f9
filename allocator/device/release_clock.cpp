// release_clock.cpp — see Note [release aftermath] in release_clock.hpp.
#include "device/release_clock.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "driver/driver.hpp"
#include "options/options.hpp"

namespace tagmem::release_clock {
namespace {

using clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
      .count();
}

// The end of the time owed, in a page of /dev/shm that every process of this user maps (so that
// a trainer sees the release its engine process just made), or in this process alone where that
// page cannot be had or the driver is an emulated one. The file is the user's own (0600, checked
// after opening), so another user can neither read nor move it.
std::int64_t* open_shared() noexcept {
  const std::string path = "/dev/shm/tagmem-release-clock-" + std::to_string(geteuid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && S_ISREG(st.st_mode) &&
      (st.st_size >= std::int64_t(sizeof(std::int64_t)) ||
       ftruncate(fd, sizeof(std::int64_t)) == 0)) {
    p = mmap(nullptr, sizeof(std::int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<std::int64_t*>(p);
}

// Whether the devices are the machine's: an emulated driver's devices belong to its process.
bool real_driver() noexcept {
  const char* lib = option_env(option::LIBCUDA);
  if (lib == nullptr) return true;
  const char* name = std::strrchr(lib, '/');
  return std::strncmp(name ? name + 1 : lib, "libcuda.so", 10) == 0;
}

std::atomic_ref<std::int64_t> until_ns() noexcept {
  static std::int64_t local = 0;
  static std::int64_t* const shared = real_driver() ? open_shared() : nullptr;
  return std::atomic_ref<std::int64_t>(shared ? *shared : local);
}

std::atomic<std::uint64_t> noted{0};  // bytes_noted()

}  // namespace

CUresult release(CUmemGenericAllocationHandle handle, std::size_t bytes) noexcept {
  const CUresult r = driver::api().cuMemRelease(handle);
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
  const std::int64_t cap = now + nanoseconds(longest).count();
  auto until = until_ns();
  std::int64_t seen = until.load(std::memory_order_relaxed);
  std::int64_t next;
  do {
    next = std::min(std::max(seen, now) + owed, cap);
  } while (!until.compare_exchange_weak(seen, next, std::memory_order_relaxed));
}

std::chrono::nanoseconds owed() noexcept {
  return std::chrono::nanoseconds(
      std::max<std::int64_t>(0, until_ns().load(std::memory_order_relaxed) - now_ns()));
}

bool after_release() noexcept { return owed() > least; }

std::uint64_t bytes_noted() noexcept { return noted.load(std::memory_order_relaxed); }

void reset() noexcept { until_ns().store(0, std::memory_order_relaxed); }

}  // namespace tagmem::release_clock
