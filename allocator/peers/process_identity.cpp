// process_identity.cpp — reading a process's start time (see header).
#include "peers/process_identity.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace tagmem::peers {

std::string process_identity::describe() const {
  std::string s = "pid " + std::to_string(pid);
  if (start) s += " (started at tick " + std::to_string(start) + ")";
  return s;
}

process_identity identity_of(pid_t pid) {
  process_identity id{pid, 0};
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return id;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return id;
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may hold anything, spaces included: the
  // fields after it start past the last ')'. The start time is field 22, the 20th after it.
  const char* p = std::strrchr(buf, ')');
  if (!p) return id;
  ++p;
  for (int field = 3; field < 22 && p; ++field) p = std::strchr(p + 1, ' ');
  if (p) id.start = std::strtoull(p + 1, nullptr, 10);
  return id;
}

}  // namespace tagmem::peers
