// c_error.hpp — the one boundary between tagmem's C++ internals and the C ABI.
//
// Note [C boundary]: every C entry point that returns a tagmem_status (c_api.cpp, and the
// integrations linked into the same library, such as the NCCL functions of the preload shim) runs
// its body through c_boundary. In a child forked after tagmem started it refuses before the body
// touches anything (Note [fork] in fork_guard.hpp); otherwise an exception becomes a status and a
// message for the calling thread's tagmem_last_error(), so no C caller ever sees an exception or
// an abort. Internals throw tagmem::error (error.hpp); what else escapes is mapped here too.
#pragma once

#include <string>

#include "tagmem/tagmem.h"

namespace tagmem {

// Stores `message` for tagmem_last_error() on this thread and returns `code`. Needs no memory
// (safe at any point of a thread's exit); a message over 1 KiB is cut and ends with "...".
tagmem_status record_c_error(tagmem_status code, const char* message) noexcept;
tagmem_status record_c_error(tagmem_status code, const std::string& message) noexcept;
// The message tagmem_last_error() returns on this thread.
const char* last_c_error() noexcept;

// Only inside a catch block: records the exception being handled and returns its status
// (tagmem::error keeps its code, std::bad_alloc is HOST_OUT_OF_MEMORY, anything else INTERNAL).
tagmem_status record_current_exception() noexcept;

// In a child forked after tagmem started: records and returns TAGMEM_ERROR_FORKED. Else success.
tagmem_status refuse_c_call_if_forked() noexcept;

// Runs `body` behind the boundary (Note [C boundary]); success when it returns.
template <class F>
tagmem_status c_boundary(F&& body) noexcept {
  if (tagmem_status s = refuse_c_call_if_forked()) return s;
  try {
    body();
    return TAGMEM_SUCCESS;
  } catch (...) {
    return record_current_exception();
  }
}

}  // namespace tagmem
