// disk_file.cpp — one backup file (Note [disk files] in disk_file.hpp).
#include "disk/disk_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "base/error.hpp"
#include "disk/disk_io.hpp"

namespace tagmem {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// The files open in this process, removed by an exit handler if still there at exit.
std::mutex g_files_mutex;
std::set<std::string>* g_files = nullptr;

void remove_left_files() noexcept {
  std::lock_guard lock(g_files_mutex);
  if (!g_files) return;
  for (const std::string& p : *g_files) ::unlink(p.c_str());
  g_files->clear();
}

void note_file(const std::string& path) {
  std::lock_guard lock(g_files_mutex);
  if (!g_files) {
    g_files = new std::set<std::string>();  // lives to the exit handler
    std::atexit(remove_left_files);
  }
  g_files->insert(path);
}

void forget_file(const std::string& path) noexcept {
  std::lock_guard lock(g_files_mutex);
  if (g_files) g_files->erase(path);
}

std::atomic<unsigned long> g_serial{0};

}  // namespace

disk_file::disk_file(const std::string& dir) {
  TAGMEM_EXPECTS(!dir.empty(), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "no disk directory: set TAGMEM_DISK_DIR or call tagmem_set_disk_dir()");
  disk_io& io = current_disk_io();
  for (int attempt = 0;; ++attempt) {
    path_ = dir + "/tagmem-" + std::to_string(::getpid()) + "-" +
            std::to_string(g_serial.fetch_add(1)) + ".bak";
    const int base = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    fd_ = io.open(path_.c_str(), base | O_DIRECT, 0600);
    direct_ = fd_ >= 0;
    if (fd_ < 0 && errno == EINVAL) fd_ = io.open(path_.c_str(), base, 0600);  // no O_DIRECT here
    if (fd_ >= 0) break;
    const int err = errno;
    if (err == EEXIST && attempt < 16) continue;  // a file of an earlier process with our pid
    fail(TAGMEM_ERROR_IO, "cannot create disk backup file " + path_ + ": " + errno_text(err));
  }
  try {
    note_file(path_);
  } catch (...) {
    io.close(fd_);
    io.unlink(path_.c_str());
    throw;
  }
}

disk_file::~disk_file() {
  disk_io& io = current_disk_io();
  io.close(fd_);
  io.unlink(path_.c_str());  // already gone if someone removed it: nothing to do
  forget_file(path_);
}

void disk_file::drop_direct(int err) {
  if (!direct_ || err != EINVAL) return;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0 && current_disk_io().fcntl_setfl(fd_, flags & ~O_DIRECT) == 0) direct_ = false;
}

void disk_file::write_all(const void* buf, std::size_t n, off_t offset) {
  disk_io& io = current_disk_io();
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = io.pwrite(fd_, p, n, offset);
    if (w < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EINVAL && direct_) {  // alignment the file system wants: plain writes from here
        drop_direct(err);
        if (!direct_) continue;
      }
      fail(TAGMEM_ERROR_IO, "writing " + std::to_string(n) + " bytes at offset " +
                                std::to_string(offset) + " of disk backup file " + path_ + ": " +
                                errno_text(err));
    }
    if (w == 0) {
      fail(TAGMEM_ERROR_IO, "writing disk backup file " + path_ + " at offset " +
                                std::to_string(offset) + " made no progress (short write)");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += w;
  }
}

void disk_file::read_all(void* buf, std::size_t n, off_t offset) {
  disk_io& io = current_disk_io();
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = io.pread(fd_, p, n, offset);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EINVAL && direct_) {
        drop_direct(err);
        if (!direct_) continue;
      }
      fail(TAGMEM_ERROR_IO, "reading " + std::to_string(n) + " bytes at offset " +
                                std::to_string(offset) + " of disk backup file " + path_ + ": " +
                                errno_text(err));
    }
    if (r == 0) {
      fail(TAGMEM_ERROR_IO, "disk backup file " + path_ + " ends at offset " +
                                std::to_string(offset) + ", " + std::to_string(n) +
                                " bytes short (was it truncated?)");
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

}  // namespace tagmem
