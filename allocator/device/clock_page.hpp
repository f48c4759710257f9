// clock_page.hpp — the file through which a user's processes share the release clock.
//
// Note [clock page]: the page is a name in a world-writable directory (/dev/shm), so whatever is
// found there may be another user's plant or a same-user process's mistake. It is created
// exclusively (a new file filled and then renamed into place, never replacing one), and one
// found there is used only if it is a regular file of this user with mode 0600, one link and
// exactly 8 bytes: a hard link to another of the user's files, planted under the name, has two.
// It is never mapped: a same-user process that truncates a mapped file would kill every user of
// it with SIGBUS; pread and pwrite of a truncated file read nothing or grow it again. A value read
// is only a hint (another process wrote it, or a torn read made it up), so its user clamps it
// (release_clock.cpp). When the name is held by something refused, one line says why and the
// process keeps a clock of its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace tagmem::release_clock {

class clock_page {
 public:
  // Opens or creates the page at `path`; empty when it is refused (`why` says why).
  static std::optional<clock_page> open(const std::string& path, std::string& why) noexcept;

  clock_page(clock_page&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  clock_page& operator=(clock_page&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  clock_page(const clock_page&) = delete;
  ~clock_page();

  // The value stored, or nullopt when the file no longer holds 8 bytes.
  std::optional<std::int64_t> read() const noexcept;
  void write(std::int64_t v) const noexcept;

 private:
  explicit clock_page(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace tagmem::release_clock
