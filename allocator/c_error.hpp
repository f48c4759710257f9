// c_error.hpp — the one boundary between tagmem's exceptions and the C ABI's statuses, for every
// C entry point: tagmem's own (c_api.cpp) and those of integrations linked into the same library
// (the NCCL functions of the preload shim). The message goes to the calling thread's
// tagmem_last_error().
#pragma once

#include <string>

#include "tagmem/tagmem.h"

namespace tagmem {

// Stores `message` for tagmem_last_error() on this thread and returns `code`.
tagmem_status record_c_error(tagmem_status code, const std::string& message) noexcept;

// In a child forked after tagmem started: records and returns TAGMEM_ERROR_FORKED (Note [fork]
// in fork_guard.hpp), to be returned before the entry point touches anything. Else success.
tagmem_status refuse_c_call_if_forked() noexcept;

// Records the exception being handled and returns its status: a tagmem::error keeps its code,
// std::bad_alloc is HOST_OUT_OF_MEMORY, anything else INTERNAL. Call only inside a catch block.
tagmem_status record_current_exception() noexcept;

// Runs `body` as a C entry point: refused in a forked child, any exception turned into a status
// and a message, so that no C caller ever sees an exception or an abort.
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
