// copy_gate.cpp — see copy_gate.hpp.
#include "handoff/copy_gate.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "handoff/handoff_point.hpp"
#include "observe/log.hpp"
#include "observe/trace.hpp"

namespace tagmem::handoff {

copy_gate::copy_gate(std::string dir, std::string job, const gpu_uuid& uuid)
    : dir_(std::move(dir)), job_(std::move(job)), uuid_(uuid) {}

copy_gate::~copy_gate() {
  std::lock_guard lock(mutex_);
  if (fd_ < 0) return;
  ::unlink(own_copy_mark(dir_, job_, uuid_).c_str());
  ::close(fd_);  // drops the lock, if a reload still held it
}

void copy_gate::begin() noexcept {
  std::lock_guard lock(mutex_);
  if (copying_++ > 0) return;
  if (fd_ < 0) {
    std::string path;
    try {
      path = own_copy_mark(dir_, job_, uuid_);
    } catch (...) {
      return;
    }
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0) {
      if (logging(log_level::info)) {
        log_line("handoff cannot-mark-copying path=\"" + path + "\" reason=\"" +
                 std::strerror(errno) + "\"");
      }
      return;
    }
  }
  // A prober holds its shared lock for a moment only.
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
  trace::counter("copy_mark", 1);
}

void copy_gate::end() noexcept {
  std::lock_guard lock(mutex_);
  if (copying_ == 0 || --copying_ > 0 || fd_ < 0) return;
  ::flock(fd_, LOCK_UN);
  trace::counter("copy_mark", 0);
}

bool copy_gate::any_held(bool others_only) noexcept {
  try {
    const pid_t self = ::getpid();
    for (const auto& [path, pid] : list_copy_marks(dir_, job_, uuid_)) {
      if (others_only && pid == self) continue;
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) continue;  // removed since listed
      const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      if (!held && ::kill(pid, 0) != 0 && errno == ESRCH) ::unlink(path.c_str());  // owner gone
      ::close(fd);
      if (held) return true;
    }
  } catch (...) {  // no memory for the list: nothing held back
  }
  return false;
}

}  // namespace tagmem::handoff
