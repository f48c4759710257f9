// sweep_stride.hpp — which calls a fault sweep fails when it takes only some of them.
//
// A sweep fails every call of an operation in turn; under a sanitizer that takes many times its
// minutes, and the calls between repeat the same paths. A stride k fails only the first, the last
// and every k-th call, the same ones on every run (the gate passes or fails the same way on the
// same code); the plain build sweeps every call.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace tagmem::test {

// The stride in the environment variable `name` (unset or empty: 1, every call). A value that is
// not a positive integer ends the test program with status 2 and a message: a sweep that silently
// ran every call, or none, would hide the mistake.
inline std::uint64_t sweep_stride(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 1;
  char* end = nullptr;
  const unsigned long long k = std::strtoull(v, &end, 10);
  if (*end != '\0' || k == 0 || *v == '-') {
    std::fprintf(stderr, "%s='%s' is not a positive integer\n", name, v);
    std::exit(2);
  }
  return k;
}

// Whether call `n` (1-based) of `count` is failed at `stride`.
inline bool swept(std::uint64_t n, std::uint64_t count, std::uint64_t stride) {
  return n == 1 || n == count || n % stride == 0;
}

}  // namespace tagmem::test
