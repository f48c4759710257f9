// exit_flag.cpp — see exit_flag.hpp.
#include "base/exit_flag.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace tagmem {
namespace {

std::atomic<bool> g_exiting{false};
std::once_flag g_hook;

}  // namespace

void watch_exit() noexcept {
  std::call_once(g_hook, [] { std::atexit([] { g_exiting = true; }); });
}

bool exiting() noexcept { return g_exiting.load(); }

}  // namespace tagmem
