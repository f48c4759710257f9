// fork_guard.cpp — the fork handler and flag of Note [fork].
#include "base/fork_guard.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace tagmem {
namespace {

std::atomic<pid_t> g_started_in{0};  // the process tagmem started in; 0: not started
std::atomic<bool> g_forked{false};   // set in a child forked after the start

void on_fork_child() noexcept {
  if (g_started_in.load(std::memory_order_relaxed) != 0) {
    g_forked.store(true, std::memory_order_relaxed);
  }
}

}  // namespace

void mark_started() {
  if (g_started_in.load(std::memory_order_acquire) != 0) return;
  // Installed once; glibc removes the handler if the library is unloaded.
  static const int installed = pthread_atfork(nullptr, nullptr, &on_fork_child);
  (void)installed;
  pid_t none = 0;
  g_started_in.compare_exchange_strong(none, getpid(), std::memory_order_acq_rel);
}

bool forked_after_start() noexcept { return g_forked.load(std::memory_order_relaxed); }

std::string forked_message() {
  return "tagmem was started in the parent process (pid " +
         std::to_string(g_started_in.load(std::memory_order_relaxed)) +
         "); this process is a child made by fork() after that, and cannot use it: the parent's "
         "tagmem threads and CUDA do not survive fork(). Use tagmem in the parent only, or start "
         "the child with exec (Python multiprocessing: the 'spawn' or 'forkserver' start method)";
}

}  // namespace tagmem
