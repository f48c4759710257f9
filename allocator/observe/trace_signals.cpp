// trace_signals.cpp — the write of the trace on SIGTERM/SIGINT (see trace_signals.hpp).
#include "observe/trace_signals.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

namespace tagmem::trace {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
struct sigaction g_previous[2];  // written before the handlers are installed, then only read
int g_request[2] = {-1, -1};     // handler -> writing thread
int g_done[2] = {-1, -1};        // writing thread -> handler
pid_t g_owner = 0;               // the process whose thread writes
void (*g_write)() = nullptr;

int slot(int sig) { return sig == SIGTERM ? 0 : 1; }

void* writer(void*) {
  for (;;) {
    char c;
    const ssize_t n = ::read(g_request[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return nullptr;
    try {
      g_write();
    } catch (...) {  // unwritable path: the process is ending, there is no one to tell
    }
    while (::write(g_done[1], &c, 1) < 0 && errno == EINTR) {
    }
  }
}

// Only async-signal-safe calls from here on: write, poll, read, getpid, sigaction, raise.
void wait_for_write() {
  char c = 1;
  if (::write(g_request[1], &c, 1) != 1) return;
  pollfd p{g_done[0], POLLIN, 0};
  int left = kSignalFlushWaitMs;
  while (left > 0) {
    const int r = ::poll(&p, 1, 100);
    if (r > 0) {
      ssize_t ignored = ::read(g_done[0], &c, 1);
      (void)ignored;
      return;
    }
    if (r < 0 && errno != EINTR) return;
    left -= 100;
  }
}

void on_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (::getpid() == g_owner) wait_for_write();
  const struct sigaction& before = g_previous[slot(sig)];
  errno = saved_errno;
  if (before.sa_flags & SA_SIGINFO) {
    before.sa_sigaction(sig, info, context);
  } else if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
    before.sa_handler(sig);
  } else {
    // The default action: put it back and raise again; the signal is blocked while this runs,
    // so it is delivered, and ends the process, when the handler returns.
    ::sigaction(sig, &before, nullptr);
    ::raise(sig);
  }
  errno = saved_errno;
}

bool make_pipe(int fds[2]) { return ::pipe2(fds, O_CLOEXEC) == 0; }

}  // namespace

void flush_on_signals(void (*write)()) noexcept {
  static bool done = false;  // configure() calls this under the trace's lock
  if (done) return;
  done = true;
  g_write = write;
  if (!make_pipe(g_request)) return;
  if (!make_pipe(g_done)) return;
  // The writing thread never runs the handler (it would wait for itself).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  const bool started = pthread_create(&t, nullptr, writer, nullptr) == 0;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!started) return;
  pthread_detach(t);
  g_owner = ::getpid();
  for (int sig : kSignals) {
    struct sigaction& before = g_previous[slot(sig)];
    if (::sigaction(sig, nullptr, &before) != 0) continue;
    if (!(before.sa_flags & SA_SIGINFO) && before.sa_handler == SIG_IGN) continue;  // ignored
    struct sigaction mine {};
    mine.sa_sigaction = on_signal;
    mine.sa_mask = before.sa_mask;  // what the previous handler ran with, as it is called here
    // Keeps the previous handler's restart behaviour (Python's handlers rely on EINTR).
    const bool was_default = !(before.sa_flags & SA_SIGINFO) && before.sa_handler == SIG_DFL;
    mine.sa_flags = SA_SIGINFO | SA_ONSTACK |
                    (was_default ? SA_RESTART : before.sa_flags & (SA_RESTART | SA_NODEFER));
    ::sigaction(sig, &mine, nullptr);
  }
}

}  // namespace tagmem::trace
