// clock_page_state.cpp — see clock_page_state.hpp.
#include "clock_page_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "device/release_clock.hpp"

namespace tagmem::test {

void use_clock_page(clock_page_state state) {
  static const std::string path =
      "/dev/shm/tagmem-test-clock-" + std::to_string(::getpid());  // this process's alone
  release_clock::reset();
  ::unlink(path.c_str());
  if (state == clock_page_state::none || !release_clock::share_through(path)) {
    release_clock::share_through("");
    return;
  }
  if (state == clock_page_state::hostile) {
    const std::int64_t far = INT64_MAX;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      (void)!::pwrite(fd, &far, sizeof far, 0);
      ::close(fd);
    }
  } else if (state == clock_page_state::truncated) {
    (void)!::truncate(path.c_str(), 0);
  }
  ::unlink(path.c_str());
}

}  // namespace tagmem::test
