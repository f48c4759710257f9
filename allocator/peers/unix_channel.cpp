// unix_channel.cpp — framed messages over a Unix stream socket (see header).
#include "peers/unix_channel.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.hpp"

namespace tagmem::peers {
namespace {

constexpr std::uint32_t kMagic = 0x4e4d4754;  // "TGMN"

struct header {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint32_t length;
  std::uint32_t fds;
};
static_assert(sizeof(header) == kFrameHeaderBytes);

// Payload bytes are read in pieces of at most this, so that a header announcing a large
// payload costs memory only as the bytes actually arrive.
constexpr std::size_t kReadChunk = 1u << 20;

}  // namespace

owned_fds& owned_fds::operator=(owned_fds&& other) noexcept {
  if (this != &other) {
    reset();
    fds_ = std::move(other.fds_);
    other.fds_.clear();
  }
  return *this;
}

int owned_fds::take(std::size_t i) {
  int fd = fds_.at(i);
  fds_[i] = -1;
  return fd;
}

void owned_fds::reset() noexcept {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  fds_.clear();
}

frame_header decode_frame_header(const void* bytes, std::size_t fds_received,
                                 const std::string& peer, const char* what) {
  header h{};
  std::memcpy(&h, bytes, sizeof h);
  if (h.magic != kMagic || h.length > kMaxPayload || h.fds != fds_received) {
    fail(TAGMEM_ERROR_PEER, peer + " sent a malformed message while " + what);
  }
  return {h.type, h.length, h.fds};
}

std::string encode_frame_header(std::uint32_t type, std::uint32_t length, std::uint32_t fds) {
  header h{kMagic, type, length, fds};
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

long long monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

unix_channel::unix_channel(int fd, std::string peer_name)
    : fd_(fd), peer_name_(std::move(peer_name)) {}

unix_channel::~unix_channel() {
  if (fd_ >= 0) ::close(fd_);
}

bool unix_channel::readable_now() const noexcept {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;  // POLLIN, or POLLHUP/POLLERR: receive says which
}

peer_credentials unix_channel::credentials() const {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    fail(TAGMEM_ERROR_PEER,
         "cannot read the credentials of " + peer_name_ + ": " + std::strerror(errno));
  }
  return {cred.pid, cred.uid};
}

void unix_channel::wait_for(short events, long long deadline_ms, const char* what) {
  for (;;) {
    long long left = deadline_ms - monotonic_ms();
    if (left <= 0) {
      fail(TAGMEM_ERROR_TIMEOUT,
           peer_name_ + " did not answer in time while " + what +
               " (did it stop calling, hang, or call a different operation?)");
    }
    pollfd p{fd_, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(left > 1000000 ? 1000000 : left));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(TAGMEM_ERROR_PEER, std::string("poll failed: ") + std::strerror(errno));
    if (n == 0) continue;
    if (p.revents & (events | POLLHUP | POLLERR)) return;
  }
}

void unix_channel::send(std::uint32_t type, const std::string& payload, const std::vector<int>& fds,
                        int timeout_ms, const char* what) {
  TAGMEM_EXPECTS(fds.size() <= kMaxFds && payload.size() <= kMaxPayload, TAGMEM_ERROR_INTERNAL,
                 "rendezvous message too large");
  const long long deadline = monotonic_ms() + timeout_ms;
  std::string bytes = encode_frame_header(type, static_cast<std::uint32_t>(payload.size()),
                                          static_cast<std::uint32_t>(fds.size()));
  bytes += payload;
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    wait_for(POLLOUT, deadline, what);
    iovec iov{const_cast<char*>(bytes.data() + sent), bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (sent == 0 && !fds.empty()) {  // the descriptors ride on the first byte
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      fail(TAGMEM_ERROR_PEER, "lost the connection to " + peer_name_ + " while " + what + ": " +
                                  std::strerror(errno) + " (did it exit?)");
    }
    sent += static_cast<std::size_t>(n);
  }
}

message unix_channel::receive(int timeout_ms, const char* what) {
  const long long deadline = monotonic_ms() + timeout_ms;
  message out;  // its descriptors close on every error path
  char raw[kFrameHeaderBytes];
  std::size_t got = 0;
  auto closed = [&] {
    fail(TAGMEM_ERROR_PEER,
         peer_name_ + " closed the connection while " + what + " (did it exit or fail?)");
  };
  while (got < sizeof raw) {
    wait_for(POLLIN, deadline, what);
    iovec iov{raw + got, sizeof raw - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      fail(TAGMEM_ERROR_PEER,
           "lost the connection to " + peer_name_ + " while " + what + ": " + std::strerror(errno));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const unsigned char* data = CMSG_DATA(c);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, data + i * sizeof fd, sizeof fd);
        out.fds.push_back(fd);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      fail(TAGMEM_ERROR_PEER, "descriptors from " + peer_name_ + " were truncated while " + what +
                                  " (too many open files? raise ulimit -n)");
    }
    if (n == 0) closed();
    got += static_cast<std::size_t>(n);
  }
  frame_header h = decode_frame_header(raw, out.fds.size(), peer_name_, what);
  out.type = h.type;
  out.payload.reserve(std::min<std::size_t>(h.length, kReadChunk));
  while (out.payload.size() < h.length) {
    wait_for(POLLIN, deadline, what);
    std::size_t have = out.payload.size();
    std::size_t want = std::min<std::size_t>(h.length - have, kReadChunk);
    out.payload.resize(have + want);
    ssize_t n = ::recv(fd_, out.payload.data() + have, want, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      out.payload.resize(have);
      continue;
    }
    if (n <= 0) closed();
    out.payload.resize(have + static_cast<std::size_t>(n));
  }
  return out;
}

}  // namespace tagmem::peers
