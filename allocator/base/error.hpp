// error.hpp — the one error idiom below the C ABI.
//
// Internals report failures by throwing tagmem::error (a status code plus a message); the C ABI
// catches it at the boundary, stores the message for tagmem_last_error() and returns the code.
// TAGMEM_EXPECTS checks user input and is always on; TAGMEM_ASSERT checks our own invariants and
// exists only in debug builds.
#pragma once

#include <stdexcept>
#include <string>

#include "tagmem/tagmem.h"

namespace tagmem {

class error : public std::runtime_error {
 public:
  error(tagmem_status code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  tagmem_status code() const noexcept { return code_; }

 private:
  tagmem_status code_;
};

[[noreturn]] void fail(tagmem_status code, const std::string& message);

}  // namespace tagmem

#define TAGMEM_EXPECTS(cond, code, message)         \
  do {                                              \
    if (!(cond)) ::tagmem::fail((code), (message)); \
  } while (0)

#ifndef NDEBUG
#define TAGMEM_ASSERT(cond)                                                                  \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::tagmem::fail(TAGMEM_ERROR_INTERNAL, std::string("invariant failed: " #cond " at ") + \
                                                __FILE__ + ":" + std::to_string(__LINE__));  \
  } while (0)
#else
#define TAGMEM_ASSERT(cond) ((void)0)
#endif
