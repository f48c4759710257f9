// handoff_point.cpp — the takers' socket files (see header).
#include "handoff/handoff_point.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/error.hpp"
#include "peers/job_identity.hpp"

namespace tagmem::handoff {
namespace {

std::string prefix(const std::string& job, const gpu_uuid& uuid) {
  return "hoff-" + peers::hash_hex(job + "\n" + uuid_hex(uuid)) + "-";
}

// Each name in `dir` of the form <want><pid><suffix>, other than this process's unless
// `with_own`, as (base path without the suffix, pid).
std::vector<std::pair<std::string, pid_t>> list_named(const std::string& dir,
                                                      const std::string& want,
                                                      const std::string& suffix, bool with_own) {
  std::vector<std::pair<std::string, pid_t>> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, want.size(), want) != 0) continue;
    if (name.size() <= want.size() + suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string digits = name.substr(want.size(), name.size() - want.size() - suffix.size());
    char* end = nullptr;
    const long pid = std::strtol(digits.c_str(), &end, 10);
    if (digits.empty() || *end != '\0' || pid <= 0 || (!with_own && pid == ::getpid())) continue;
    out.emplace_back(dir + "/" + want + digits, static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

}  // namespace

peers::rendezvous_paths own_point(const std::string& dir, const std::string& job,
                                  const gpu_uuid& uuid) {
  const std::string base = dir + "/" + prefix(job, uuid) + std::to_string(::getpid());
  peers::rendezvous_paths p{base + ".sock", base + ".lock"};
  TAGMEM_EXPECTS(p.socket.size() < sizeof(sockaddr_un{}.sun_path), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "the handoff socket path '" + p.socket +
                     "' is too long for a Unix socket; set TAGMEM_PEER_DIR to a shorter directory");
  return p;
}

std::vector<receiver_address> list_receivers(const std::string& dir, const std::string& job,
                                             const gpu_uuid& uuid) {
  std::vector<receiver_address> out;
  for (const auto& [base, pid] : list_named(dir, prefix(job, uuid), ".sock", false)) {
    out.push_back({{base + ".sock", base + ".lock"}, pid});
  }
  return out;
}

std::string own_copy_mark(const std::string& dir, const std::string& job, const gpu_uuid& uuid) {
  return dir + "/" + prefix(job, uuid) + std::to_string(::getpid()) + ".copy";
}

std::vector<std::pair<std::string, pid_t>> list_copy_marks(const std::string& dir,
                                                           const std::string& job,
                                                           const gpu_uuid& uuid) {
  auto marks = list_named(dir, prefix(job, uuid), ".copy", true);
  for (auto& m : marks) m.first += ".copy";
  return marks;
}

int connect_to(const receiver_address& a) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (a.paths.socket.size() >= sizeof addr.sun_path) {
    ::close(fd);
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(addr.sun_path, a.paths.socket.c_str(), a.paths.socket.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

bool remove_if_abandoned(const receiver_address& a) {
  const int fd = ::open(a.paths.lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {  // no lock file: a socket without an owner
    if (errno != ENOENT) return false;
    struct stat st {};
    if (::lstat(a.paths.socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      ::unlink(a.paths.socket.c_str());
    }
    return true;
  }
  bool removed = false;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    struct stat held {
    }, at_path{};
    // Only if the file locked is still the one at the path (its owner unlinks it on the way out).
    if (::fstat(fd, &held) == 0 && ::lstat(a.paths.lock.c_str(), &at_path) == 0 &&
        held.st_dev == at_path.st_dev && held.st_ino == at_path.st_ino) {
      ::unlink(a.paths.socket.c_str());
      ::unlink(a.paths.lock.c_str());
      removed = true;
    }
  }
  ::close(fd);
  return removed;
}

}  // namespace tagmem::handoff
