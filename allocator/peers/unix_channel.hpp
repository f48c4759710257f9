// unix_channel.hpp — one connected Unix stream socket carrying framed messages with file
// descriptors, every wait bounded.
//
// A message is a 16-byte header (magic, type, payload length, descriptor count) and a payload;
// up to kMaxFds descriptors ride on its first byte as SCM_RIGHTS. Received descriptors are
// close-on-exec and owned by the receiver through owned_fds, which closes whatever nobody took
// when it goes out of scope: no error path can leak one. A peer that closes the connection,
// sends garbage or stays silent past the deadline gives PEER or TIMEOUT naming the peer and what
// was awaited; nothing blocks forever and SIGPIPE is never raised.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tagmem::peers {

inline constexpr std::size_t kMaxFds = 200;              // below the kernel's 253 per message
inline constexpr std::uint32_t kMaxPayload = 64u << 20;  // what one message may carry
inline constexpr std::size_t kFrameHeaderBytes = 16;

// File descriptors this process owns; closed on destruction unless taken.
class owned_fds {
 public:
  owned_fds() = default;
  ~owned_fds() { reset(); }
  owned_fds(owned_fds&& other) noexcept : fds_(std::move(other.fds_)) { other.fds_.clear(); }
  owned_fds& operator=(owned_fds&& other) noexcept;
  owned_fds(const owned_fds&) = delete;
  owned_fds& operator=(const owned_fds&) = delete;

  void push_back(int fd) { fds_.push_back(fd); }
  std::size_t size() const { return fds_.size(); }
  bool empty() const { return fds_.empty(); }
  int operator[](std::size_t i) const { return fds_[i]; }
  const std::vector<int>& view() const { return fds_; }
  // Gives up ownership of descriptor i (the slot becomes -1); the caller closes it.
  int take(std::size_t i);
  void reset() noexcept;  // closes them all

 private:
  std::vector<int> fds_;
};

struct message {
  std::uint32_t type = 0;
  std::string payload;
  owned_fds fds;
};

// The frame header: what it announces, once checked.
struct frame_header {
  std::uint32_t type = 0;
  std::uint32_t length = 0;
  std::uint32_t fds = 0;
};
// Checks kFrameHeaderBytes bytes and the number of descriptors that came with them; throws PEER
// (naming `peer` and `what`) on a bad magic, a payload over kMaxPayload or a descriptor count
// that differs.
frame_header decode_frame_header(const void* bytes, std::size_t fds_received,
                                 const std::string& peer, const char* what);
std::string encode_frame_header(std::uint32_t type, std::uint32_t length, std::uint32_t fds);

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

  // `what` completes "... while <what>" in error messages. `fds` stay the caller's.
  void send(std::uint32_t type, const std::string& payload, const std::vector<int>& fds,
            int timeout_ms, const char* what);
  message receive(int timeout_ms, const char* what);
  // Whether receive would find something (or the peer's end) without waiting.
  bool readable_now() const noexcept;

  peer_credentials credentials() const;  // SO_PEERCRED; throws PEER
  void set_peer_name(std::string name) { peer_name_ = std::move(name); }
  const std::string& peer_name() const { return peer_name_; }

 private:
  void wait_for(short events, long long deadline_ms, const char* what);
  int fd_;
  std::string peer_name_;
};

long long monotonic_ms();

}  // namespace tagmem::peers
