// peer.hpp — a second process for the two-rank tests, and the control channel between them.
//
// The test process (rank 0) starts this same binary again with --peer=<scenario>; main()
// runs the scenario registered under that name (TAGMEM_PEER_SCENARIO) as rank 1 instead of the
// tests. Both inherit the environment, so the peer runs under the shim and the emulator too.
// The two talk over a socketpair: short text messages, optionally carrying file descriptors
// (the POSIX-fd handles NCCL would pass between ranks), every wait bounded. A test may also
// start another program built next to this binary, without the shim, the same way.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tagmem::preload_test {

class control {
 public:
  explicit control(int fd = -1) : fd_(fd) {}
  void send(const std::string& text, const std::vector<int>& fds = {});
  // Throws std::runtime_error on timeout or a closed channel.
  std::string receive(std::vector<int>* fds = nullptr, int timeout_ms = 60000);
  // Waits for `expected`; throws if something else arrives.
  void expect(const std::string& expected, int timeout_ms = 60000);
  int fd() const { return fd_; }

 private:
  int fd_;
};

struct peer_args {
  std::string scenario;
  std::string group;
  control channel;
};

class peer_process {
 public:
  peer_process(const std::string& scenario, const std::string& group);
  // The same, with `settings` ("NAME=value" each) replacing those variables of its environment;
  // a bare "NAME" removes that variable.
  peer_process(const std::string& scenario, const std::string& group,
               const std::vector<std::string>& settings);
  // Another program of this binary's directory, started with `args` and without the shim
  // (LD_PRELOAD left out of its environment). Its end of the channel is fd 100.
  static std::unique_ptr<peer_process> program(const std::string& name,
                                               const std::vector<std::string>& args);
  ~peer_process();  // kills it if still running
  control& channel() { return channel_; }
  pid_t pid() const { return pid_; }
  // The exit status (0 = its checks passed); -1 if it had to be killed after `timeout_ms`.
  int wait(int timeout_ms = 60000);
  void kill_now();

 private:
  peer_process() = default;
  void start(const std::string& exe, std::vector<std::string> argv, char** envp);

  pid_t pid_ = -1;
  control channel_;
  bool reaped_ = false;
};

using scenario_fn = std::function<int(peer_args&)>;
// Registers a scenario the peer process can run; returns true (for static registration).
bool register_scenario(const std::string& name, scenario_fn fn);
#define TAGMEM_PEER_SCENARIO(name)                                                              \
  static int name(::tagmem::preload_test::peer_args&);                                          \
  static const bool name##_registered = ::tagmem::preload_test::register_scenario(#name, name); \
  static int name(::tagmem::preload_test::peer_args& args)

// Runs the peer scenario if argv asks for one: returns its exit code, or -1 for test mode.
int run_peer_if_asked(int argc, char** argv);

// A group name unique to this test run.
std::string unique_group(const std::string& test);

}  // namespace tagmem::preload_test
