// c_error.cpp — the calling thread's last message and the mapping from exceptions to statuses
// (Note [C boundary] in c_error.hpp).
#include "api/c_error.hpp"

#include <cstdio>
#include <exception>
#include <new>

#include "base/error.hpp"
#include "base/fork_guard.hpp"

namespace tagmem {
namespace {

// The message lives in a std::string while the thread runs; once that thread_local is destroyed
// (a thread's exit destructors may still call tagmem: Note [heap at thread exit] in
// metadata_heap.cpp) in a fixed buffer, which has no destructor. (A thread whose first message
// comes from a pthread key destructor leaves that string's memory behind: a thread_local made
// then is never destroyed.)
constinit thread_local bool t_text_gone = false;
constinit thread_local char t_exit_text[512] = {};

struct last_error {
  std::string text;
  ~last_error() { t_text_gone = true; }
};
thread_local last_error t_last_error;

}  // namespace

tagmem_status record_c_error(tagmem_status code, const char* message) noexcept {
  if (t_text_gone) {
    std::snprintf(t_exit_text, sizeof t_exit_text, "%s", message);
    return code;
  }
  try {
    t_last_error.text = message;
  } catch (...) {
  }
  return code;
}

tagmem_status record_c_error(tagmem_status code, const std::string& message) noexcept {
  return record_c_error(code, message.c_str());
}

const char* last_c_error() noexcept {
  return t_text_gone ? t_exit_text : t_last_error.text.c_str();
}

tagmem_status record_current_exception() noexcept {
  try {
    throw;
  } catch (const error& e) {
    return record_c_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return record_c_error(TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                          "out of host memory for tagmem's records");
  } catch (const std::exception& e) {
    try {
      return record_c_error(TAGMEM_ERROR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {  // no memory for the prefix
      return record_c_error(TAGMEM_ERROR_INTERNAL, e.what());
    }
  } catch (...) {
    return record_c_error(TAGMEM_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

tagmem_status refuse_c_call_if_forked() noexcept {
  if (!forked_after_start()) return TAGMEM_SUCCESS;
  try {
    return record_c_error(TAGMEM_ERROR_FORKED, forked_message());
  } catch (...) {
    return TAGMEM_ERROR_FORKED;
  }
}

}  // namespace tagmem
