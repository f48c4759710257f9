// disk_io.hpp — the system calls the disk tier makes, behind one small seam.
//
// Every file operation of the disk tier goes through the current disk_io, so that tests can make
// a write short, the disk full (ENOSPC) or the device fail (EIO) at a chosen call without a real
// failing disk. The default forwards to the system; calls return what the system call returns
// and leave errno as it left it.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace tagmem {

class disk_io {
 public:
  virtual ~disk_io() = default;
  virtual int open(const char* path, int flags, mode_t mode);
  virtual ssize_t pwrite(int fd, const void* buf, std::size_t n, off_t offset);
  virtual ssize_t pread(int fd, void* buf, std::size_t n, off_t offset);
  virtual int fcntl_setfl(int fd, int flags);
  virtual int close(int fd);
  virtual int unlink(const char* path);
};

// The disk_io in use (the system's unless a test replaced it).
disk_io& current_disk_io() noexcept;
// Replaces it (nullptr: the system's again); returns the previous one. For tests: not to be
// called while a disk offload or reload runs.
disk_io* replace_disk_io(disk_io* io) noexcept;

}  // namespace tagmem
