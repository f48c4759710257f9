// peer.cpp — the peer process and its control channel (see header).
#include "peer.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string_view>
#include <thread>

extern char** environ;

namespace tagmem::preload_test {
namespace {

std::map<std::string, scenario_fn>& scenarios() {
  static std::map<std::string, scenario_fn> m;
  return m;
}

}  // namespace

void control::send(const std::string& text, const std::vector<int>& fds) {
  std::string bytes = std::to_string(text.size()) + ":" + text;
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int) * 16)];
  if (!fds.empty()) {
    if (fds.size() > 16) throw std::runtime_error("too many fds for one control message");
    msg.msg_control = buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (::sendmsg(fd_, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size()))
    throw std::runtime_error("control channel: send failed");
}

std::string control::receive(std::vector<int>* fds, int timeout_ms) {
  std::string data;
  std::size_t want = std::string::npos;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (want == std::string::npos || data.size() < want) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) throw std::runtime_error("control channel: timed out waiting for the peer");
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char chunk[4096];
    iovec iov{chunk, want == std::string::npos ? 1 : std::min(sizeof chunk, want - data.size())};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int) * 16)];
    msg.msg_control = buf;
    msg.msg_controllen = sizeof buf;
    ssize_t n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) throw std::runtime_error("control channel: the peer closed it");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      const int* got = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (int i = 0; i < count; ++i) {
        if (fds) {
          fds->push_back(got[i]);
        } else {
          ::close(got[i]);
        }
      }
    }
    data.append(chunk, static_cast<std::size_t>(n));
    if (want == std::string::npos) {
      auto colon = data.find(':');
      if (colon != std::string::npos) {
        want = std::stoull(data.substr(0, colon));
        data.erase(0, colon + 1);
      }
    }
  }
  return data;
}

void control::expect(const std::string& expected, int timeout_ms) {
  std::string got = receive(nullptr, timeout_ms);
  if (got != expected)
    throw std::runtime_error("control channel: expected '" + expected + "', got '" + got + "'");
}

namespace {

// The real path of this binary, not /proc/self/exe: the shim recognises it by its name.
std::string own_path() {
  char exe[4096] = {};
  if (::readlink("/proc/self/exe", exe, sizeof exe - 1) <= 0) throw std::runtime_error("readlink");
  return exe;
}

}  // namespace

peer_process::peer_process(const std::string& scenario, const std::string& group) {
  std::string exe = own_path();
  start(exe, {exe, "--peer=" + scenario, "--group=" + group, "--control=100"}, environ);
}

peer_process::peer_process(const std::string& scenario, const std::string& group,
                           const std::vector<std::string>& settings) {
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry = *e;
    const std::string_view name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& s : settings) replaced |= s.rfind(name, 0) == 0 || s + "=" == name;
    if (!replaced) env.push_back(*e);
  }
  std::vector<std::string> copies = settings;
  for (std::string& s : copies)
    if (s.find('=') != std::string::npos) env.push_back(s.data());
  env.push_back(nullptr);
  std::string exe = own_path();
  start(exe, {exe, "--peer=" + scenario, "--group=" + group, "--control=100"}, env.data());
}

std::unique_ptr<peer_process> peer_process::program(const std::string& name,
                                                    const std::vector<std::string>& args) {
  std::string exe = own_path();
  exe = exe.substr(0, exe.rfind('/') + 1) + name;
  std::vector<char*> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.push_back(*e);
  env.push_back(nullptr);
  std::vector<std::string> argv{exe};
  argv.insert(argv.end(), args.begin(), args.end());
  std::unique_ptr<peer_process> p(new peer_process());
  p->start(exe, std::move(argv), env.data());
  return p;
}

void peer_process::start(const std::string& exe, std::vector<std::string> argv, char** envp) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error("socketpair failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 100);  // dup2 clears close-on-exec
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  int rc = posix_spawn(&pid_, exe.c_str(), &fa, nullptr, args.data(), envp);
  posix_spawn_file_actions_destroy(&fa);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    throw std::runtime_error("posix_spawn of " + exe + " failed");
  }
  channel_ = control(sv[0]);
}

peer_process::~peer_process() {
  if (!reaped_) {
    kill_now();
  }
  if (channel_.fd() >= 0) ::close(channel_.fd());
}

void peer_process::kill_now() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  reaped_ = true;
}

int peer_process::wait(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill_now();
  return -1;
}

bool register_scenario(const std::string& name, scenario_fn fn) {
  scenarios()[name] = std::move(fn);
  return true;
}

int run_peer_if_asked(int argc, char** argv) {
  peer_args args;
  int control_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--peer=", 0) == 0) args.scenario = a.substr(7);
    if (a.rfind("--group=", 0) == 0) args.group = a.substr(8);
    if (a.rfind("--control=", 0) == 0) control_fd = std::stoi(a.substr(10));
  }
  if (args.scenario.empty()) return -1;
  args.channel = control(control_fd);
  auto it = scenarios().find(args.scenario);
  if (it == scenarios().end()) {
    std::fprintf(stderr, "[peer] no scenario '%s'\n", args.scenario.c_str());
    return 2;
  }
  try {
    return it->second(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[peer %s] %s\n", args.scenario.c_str(), e.what());
    return 3;
  }
}

std::string unique_group(const std::string& test) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return "t" + std::to_string(::getpid()) + "-" + std::to_string(ts.tv_nsec % 100000) + "-" + test;
}

}  // namespace tagmem::preload_test
