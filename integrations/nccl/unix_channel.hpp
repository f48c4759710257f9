// unix_channel.hpp — one connected Unix stream socket carrying framed messages with file
// descriptors, every wait bounded.
//
// A message is a 16-byte header (magic, type, payload length, descriptor count) and a payload;
// up to kMaxFds descriptors ride on its first byte as SCM_RIGHTS. Received descriptors are
// close-on-exec and owned by the receiver. A peer that closes the connection, sends garbage or
// stays silent past the deadline gives PEER or TIMEOUT naming the peer and what was awaited;
// nothing blocks forever and SIGPIPE is never raised.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tagmem::nccl {

inline constexpr std::size_t kMaxFds = 200;  // below the kernel's 253 per message

struct message {
  std::uint32_t type = 0;
  std::string payload;
  std::vector<int> fds;  // owned by the receiver
};

struct peer_credentials {
  pid_t pid = 0;
  uid_t uid = 0;
};

class unix_channel {
 public:
  unix_channel(int fd, std::string peer_name);  // owns fd
  ~unix_channel();
  unix_channel(const unix_channel&) = delete;
  unix_channel& operator=(const unix_channel&) = delete;

  // `what` completes "... while <what>" in error messages.
  void send(std::uint32_t type, const std::string& payload, const std::vector<int>& fds,
            int timeout_ms, const char* what);
  message receive(int timeout_ms, const char* what);

  peer_credentials credentials() const;  // SO_PEERCRED; throws PEER
  void set_peer_name(std::string name) { peer_name_ = std::move(name); }
  const std::string& peer_name() const { return peer_name_; }

 private:
  void wait_for(short events, long long deadline_ms, const char* what);
  int fd_;
  std::string peer_name_;
};

long long monotonic_ms();

}  // namespace tagmem::nccl
