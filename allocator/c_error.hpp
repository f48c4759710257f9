// c_error.hpp — lets C entry points defined outside c_api.cpp (integrations linked into the same
// library, such as the NCCL functions of the preload shim) report failures the way tagmem's own
// do: the message goes to the calling thread's tagmem_last_error().
#pragma once

#include <string>

#include "tagmem/tagmem.h"

namespace tagmem {

// Stores `message` for tagmem_last_error() on this thread and returns `code`.
tagmem_status record_c_error(tagmem_status code, const std::string& message) noexcept;

// In a child forked after tagmem started: records and returns TAGMEM_ERROR_FORKED (Note [fork]
// in fork_guard.hpp), to be returned before the entry point touches anything. Else success.
tagmem_status refuse_c_call_if_forked() noexcept;

}  // namespace tagmem
