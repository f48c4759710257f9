// clock_page.cpp — see Note [clock page] in clock_page.hpp.
#include "device/clock_page.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tagmem::release_clock {
namespace {

constexpr mode_t kMode = 0600;

// Why the file open as `fd` may not serve as the page, or empty when it may.
std::string refusal(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return std::string("fstat failed: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "owned by uid " + std::to_string(st.st_uid);
  if ((st.st_mode & 07777) != kMode) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    return std::string("mode ") + mode + ", not 0600";
  }
  if (st.st_nlink != 1) return std::to_string(st.st_nlink) + " links, not 1";
  if (st.st_size != std::int64_t(sizeof(std::int64_t))) {
    return std::to_string(st.st_size) + " bytes, not 8";
  }
  return {};
}

// A new page at `path`: a zeroed file made under a name of this process's, then renamed to
// `path` unless something is there already. -1 when `path` exists (or the directory refuses).
int create(const std::string& path) {
  const std::string tmp = path + ".new" + std::to_string(getpid());
  unlink(tmp.c_str());  // a leftover of an earlier process with our pid (only ours can be there)
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kMode);
  if (fd < 0) return -1;
  const std::int64_t zero = 0;
  // fchmod: the umask may have taken bits off.
  if (fchmod(fd, kMode) != 0 || pwrite(fd, &zero, sizeof zero, 0) != sizeof zero ||
      renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
    unlink(tmp.c_str());
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::optional<clock_page> clock_page::open(const std::string& path, std::string& why) noexcept {
  try {
    int fd = create(path);
    if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      why = std::string("cannot open: ") + std::strerror(errno);
      return std::nullopt;
    }
    why = refusal(fd);
    if (!why.empty()) {
      close(fd);
      return std::nullopt;
    }
    return clock_page(fd);
  } catch (...) {  // std::bad_alloc from a string
    why = "out of memory";
    return std::nullopt;
  }
}

clock_page::~clock_page() {
  if (fd_ >= 0) close(fd_);
}

std::optional<std::int64_t> clock_page::read() const noexcept {
  std::int64_t v = 0;
  if (pread(fd_, &v, sizeof v, 0) != sizeof v) return std::nullopt;
  return v;
}

void clock_page::write(std::int64_t v) const noexcept {
  // A short write (the disk is full, the file was replaced) leaves only a hint the worse.
  (void)!pwrite(fd_, &v, sizeof v, 0);
}

}  // namespace tagmem::release_clock
