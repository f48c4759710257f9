// unix_channel.cpp — framed messages over a Unix stream socket (see header).
#include "unix_channel.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "error.hpp"

namespace tagmem::nccl {
namespace {

constexpr std::uint32_t kMagic = 0x4e4d4754;  // "TGMN"
constexpr std::uint32_t kMaxPayload = 64u << 20;

struct header {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint32_t length;
  std::uint32_t fds;
};

}  // namespace

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
  header h{kMagic, type, static_cast<std::uint32_t>(payload.size()),
           static_cast<std::uint32_t>(fds.size())};
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
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
  message out;
  header h{};
  std::size_t got = 0;
  auto closed = [&] {
    for (int fd : out.fds) ::close(fd);
    fail(TAGMEM_ERROR_PEER,
         peer_name_ + " closed the connection while " + what + " (did it exit or fail?)");
  };
  while (got < sizeof h) {
    wait_for(POLLIN, deadline, what);
    iovec iov{reinterpret_cast<char*>(&h) + got, sizeof h - got};
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
      const int* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
      out.fds.insert(out.fds.end(), fds, fds + count);
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      for (int fd : out.fds) ::close(fd);
      fail(TAGMEM_ERROR_PEER, "descriptors from " + peer_name_ + " were truncated while " + what +
                                  " (too many open files? raise ulimit -n)");
    }
    if (n == 0) closed();
    got += static_cast<std::size_t>(n);
  }
  if (h.magic != kMagic || h.length > kMaxPayload || h.fds != out.fds.size()) {
    for (int fd : out.fds) ::close(fd);
    fail(TAGMEM_ERROR_PEER, peer_name_ + " sent a malformed message while " + what);
  }
  out.type = h.type;
  out.payload.resize(h.length);
  for (got = 0; got < h.length;) {
    wait_for(POLLIN, deadline, what);
    ssize_t n = ::recv(fd_, out.payload.data() + got, h.length - got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) closed();
    got += static_cast<std::size_t>(n);
  }
  return out;
}

}  // namespace tagmem::nccl
