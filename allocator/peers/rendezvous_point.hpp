// rendezvous_point.hpp — where rank 0 of a group listens, and the lock that makes it rank 0.
//
// In the private directory (private_dir.hpp), group G of job J uses <G>-<H>.sock and <G>-<H>.lock,
// where H is a 64-bit hash of J in hex (the job identity can be long; a Unix socket path is
// short). The hash only picks the files: the job and group are compared in full in the hello.
//
// Rank 0 holds an exclusive flock on the lock file for the listener's whole life. The kernel
// drops it when the process dies, however it dies, so a socket file found while holding the
// lock was left by a dead rank 0 and is removed: a rank 0 restarted after kill -9 (torchrun
// keeps the run id, so the same files) simply takes over. A lock held by a live process means
// another process is rank 0 of that group now: an error naming it. On the way out the socket
// and the lock file are unlinked while the lock is still held; a process that opened the lock
// file just before finds, once it gets the lock, that its file is no longer the one at the
// path, and starts over.
#pragma once

#include <string>

namespace tagmem::peers {

struct rendezvous_paths {
  std::string socket;
  std::string lock;
};

// Throws INVALID_ARGUMENT when the paths do not fit a Unix socket address, and what
// private_dir() throws.
rendezvous_paths rendezvous_paths_for(const std::string& job, const std::string& group);

class rendezvous_listener {
 public:
  // Takes the lock, removes a socket file left by a dead rank 0, binds and listens with room for
  // `backlog` connections. `who` names the group in messages. Throws PEER.
  rendezvous_listener(const rendezvous_paths& paths, int backlog, const std::string& who);
  ~rendezvous_listener();
  rendezvous_listener(const rendezvous_listener&) = delete;
  rendezvous_listener& operator=(const rendezvous_listener&) = delete;

  int fd() const { return fd_; }

 private:
  rendezvous_paths paths_;
  int lock_fd_ = -1;
  int fd_ = -1;
};

}  // namespace tagmem::peers
