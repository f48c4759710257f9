// eventually.hpp — waiting in a test for something another thread or process does, with a bound
// that only keeps a broken run from hanging (no timing assertion).
#pragma once

#include <chrono>
#include <thread>

namespace tagmem::test {

// Polls `done` every 5 ms for at most 10 s; whether it came true.
template <class Done>
bool eventually(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace tagmem::test
