// frame_kill.cpp — kill points between the steps of the handoff protocol, for kill_test.cpp.
//
// The emulated driver kills a process at a driver call (TAGMEM_EMU_KILL_AT); the steps of a
// hand-over that make no driver call (a hello, a welcome, a TAKEN, a DONE) need another trigger.
// This binary defines sendmsg, so tagmem's channels (linked in statically) call it here: with
// HANDOFF_TEST_KILL_AFTER=<frame>:<n> in the environment, the process dies (SIGKILL) right after
// it has sent its nth frame of that type, as a process killed between two steps would. <frame>
// is hello, welcome, give, taken or done (handoff/handoff_messages.hpp). Without the variable the
// call goes straight through.
#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "handoff/handoff_messages.hpp"
#include "peers/unix_channel.hpp"

namespace {

using sendmsg_fn = ssize_t (*)(int, const msghdr*, int);

struct kill_point {
  std::uint32_t type = 0;  // 0: none
  long nth = 0;
};

kill_point parse(const char* spec) {
  if (!spec) return {};
  const std::string s = spec;
  const std::size_t colon = s.find(':');
  const std::string name = s.substr(0, colon);
  std::uint32_t type = 0;
  if (name == "hello") type = tagmem::handoff::kHoffHello;
  if (name == "welcome") type = tagmem::handoff::kHoffWelcome;
  if (name == "give") type = tagmem::handoff::kHoffGive;
  if (name == "taken") type = tagmem::handoff::kHoffTaken;
  if (name == "done") type = tagmem::handoff::kHoffDone;
  const long nth = colon == std::string::npos ? 0 : std::atol(s.c_str() + colon + 1);
  if (type == 0 || nth <= 0) ::abort();  // a mistyped test, not a condition under test
  return {type, nth};
}

// The frame type a send starts with (the channel's own decoder reads the header), or 0 when it
// does not start a frame.
std::uint32_t frame_type(const msghdr* msg) {
  if (!msg || msg->msg_iovlen == 0 || msg->msg_iov[0].iov_len < tagmem::peers::kFrameHeaderBytes) {
    return 0;
  }
  std::size_t fds = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(const_cast<msghdr*>(msg), c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      fds += (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    }
  }
  try {
    return tagmem::peers::decode_frame_header(msg->msg_iov[0].iov_base, fds, "", "").type;
  } catch (...) {  // not a frame's start
    return 0;
  }
}

}  // namespace

extern "C" ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  static const sendmsg_fn real = reinterpret_cast<sendmsg_fn>(::dlsym(RTLD_NEXT, "sendmsg"));
  static const kill_point at = parse(std::getenv("HANDOFF_TEST_KILL_AFTER"));
  static std::atomic<long> seen{0};
  const std::uint32_t type = at.type ? frame_type(msg) : 0;
  const ssize_t n = real(fd, msg, flags);
  if (n > 0 && type == at.type && type != 0 && seen.fetch_add(1) + 1 == at.nth) ::raise(SIGKILL);
  return n;
}
