// rendezvous_point.cpp — rank 0's socket and lock (see header).
#include "peers/rendezvous_point.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "base/error.hpp"
#include "peers/job_identity.hpp"
#include "peers/private_dir.hpp"

namespace tagmem::peers {
namespace {

// Holds the lock at `path` and returns its fd; throws PEER if a live process holds it.
int take_lock(const std::string& path, const std::string& who) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      fail(TAGMEM_ERROR_PEER,
           "cannot open the rendezvous lock '" + path + "': " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        fail(TAGMEM_ERROR_PEER, who + ": another live process is rank 0 now (it holds '" + path +
                                    "'); each rank must call with its own rank");
      }
      fail(TAGMEM_ERROR_PEER, "cannot lock '" + path + "': " + std::strerror(err));
    }
    struct stat held {
    }, at_path{};
    if (::fstat(fd, &held) == 0 && ::lstat(path.c_str(), &at_path) == 0 &&
        held.st_dev == at_path.st_dev && held.st_ino == at_path.st_ino) {
      return fd;
    }
    ::close(fd);  // its holder removed it on the way out: the lock is a new file now
  }
  fail(TAGMEM_ERROR_PEER, "cannot take the rendezvous lock '" + path + "': it keeps changing");
}

sockaddr_un address_of(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

}  // namespace

rendezvous_paths rendezvous_paths_for(const std::string& job, const std::string& group) {
  std::string base = private_dir() + "/" + group + "-" + hash_hex(job);
  rendezvous_paths p{base + ".sock", base + ".lock"};
  TAGMEM_EXPECTS(p.socket.size() < sizeof(sockaddr_un{}.sun_path), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "the rendezvous socket path '" + p.socket +
                     "' is too long for a Unix socket; set TAGMEM_PEER_DIR to a shorter directory");
  return p;
}

rendezvous_listener::rendezvous_listener(const rendezvous_paths& paths, int backlog,
                                         const std::string& who)
    : paths_(paths) {
  lock_fd_ = take_lock(paths_.lock, who);
  bool bound = false;
  try {
    struct stat st {};
    if (::lstat(paths_.socket.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        fail(TAGMEM_ERROR_PEER,
             who + ": '" + paths_.socket + "' exists and is no socket; tagmem leaves it alone");
      }
      ::unlink(paths_.socket.c_str());  // left by a rank 0 that died: nobody else holds the lock
    }
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) fail(TAGMEM_ERROR_PEER, std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr = address_of(paths_.socket);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      fail(TAGMEM_ERROR_PEER,
           "cannot bind the rendezvous socket '" + paths_.socket + "': " + std::strerror(errno));
    }
    bound = true;
    if (::listen(fd_, backlog) != 0) {
      fail(TAGMEM_ERROR_PEER, "listen on '" + paths_.socket + "': " + std::strerror(errno));
    }
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    if (bound) ::unlink(paths_.socket.c_str());
    ::unlink(paths_.lock.c_str());
    ::close(lock_fd_);
    throw;
  }
}

rendezvous_listener::~rendezvous_listener() {
  ::close(fd_);
  ::unlink(paths_.socket.c_str());
  ::unlink(paths_.lock.c_str());  // still held: see the header
  ::close(lock_fd_);
}

}  // namespace tagmem::peers
