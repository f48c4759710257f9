// disk_file.hpp — one backup file of the disk tier.
//
// Note [disk files]: a file is created under the disk directory with a unique name
// (tagmem-<pid>-<n>.bak, O_EXCL, mode 0600) and its descriptor is held open until the backup
// goes: a reload reads through the descriptor, so a file removed from the directory meanwhile is
// still read back whole (its blocks live until the descriptor closes), while a truncated one is
// an error. The file is named, not O_TMPFILE, because callers (torch_memory_saver's contract)
// look for the backup files in the directory while a tag is offloaded. It is removed when the
// backup goes (after a reload, when the tag or tagmem goes) and at normal process exit for any
// left; only a process killed outright leaves files behind. O_DIRECT is used where the file
// system takes it (not tmpfs) and given up for plain writes at the first EINVAL, so the page
// cache does not hold a second copy of what was meant to leave host memory.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace tagmem {

class disk_file {
 public:
  // Creates a new file in `dir`; throws IO (with the path and errno's text) on failure.
  explicit disk_file(const std::string& dir);
  ~disk_file();  // closes and removes it
  disk_file(const disk_file&) = delete;
  disk_file& operator=(const disk_file&) = delete;

  const std::string& path() const noexcept { return path_; }
  bool direct() const noexcept { return direct_; }

  // Writes all of [buf, buf + n) at `offset`, going on after short writes; throws IO on an error
  // (ENOSPC, EIO, ...) or a write that makes no progress.
  void write_all(const void* buf, std::size_t n, off_t offset);
  // Reads exactly n bytes at `offset`; throws IO on an error or an early end of file (a file
  // truncated under tagmem).
  void read_all(void* buf, std::size_t n, off_t offset);

 private:
  void drop_direct(int err);
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
};

}  // namespace tagmem
