// disk_io.cpp — the system's disk_io and the seam's current instance (see disk_io.hpp).
#include "disk/disk_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>

namespace tagmem {

int disk_io::open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }

ssize_t disk_io::pwrite(int fd, const void* buf, std::size_t n, off_t offset) {
  return ::pwrite(fd, buf, n, offset);
}

ssize_t disk_io::pread(int fd, void* buf, std::size_t n, off_t offset) {
  return ::pread(fd, buf, n, offset);
}

int disk_io::fcntl_setfl(int fd, int flags) { return ::fcntl(fd, F_SETFL, flags); }

int disk_io::close(int fd) { return ::close(fd); }

int disk_io::unlink(const char* path) { return ::unlink(path); }

namespace {
disk_io g_system;
std::atomic<disk_io*> g_current{&g_system};
}  // namespace

disk_io& current_disk_io() noexcept { return *g_current.load(std::memory_order_acquire); }

disk_io* replace_disk_io(disk_io* io) noexcept {
  disk_io* previous = g_current.exchange(io ? io : &g_system, std::memory_order_acq_rel);
  return previous == &g_system ? nullptr : previous;
}

}  // namespace tagmem
