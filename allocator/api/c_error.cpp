// c_error.cpp — the calling thread's last message and the mapping from exceptions to statuses
// (Note [C boundary] in c_error.hpp).
#include "api/c_error.hpp"

#include <cstring>
#include <exception>
#include <new>

#include "base/error.hpp"
#include "base/fork_guard.hpp"

namespace tagmem {
namespace {

// The message lives in a fixed per-thread buffer with no destructor, so a call from any point of a
// thread's exit (a C++ thread_local destructor, or a pthread key destructor, which runs after
// those: Note [heap at thread exit] in metadata_heap.cpp) records its message and leaves nothing
// behind. A thread_local with a destructor, first touched that late, is never destroyed: glibc
// registers no destructor once the thread's own have run, and its memory would leak. Longer
// messages are cut, and end with "..." so that a reader knows.
constexpr std::size_t kMessageBytes = 1024;
constinit thread_local char t_text[kMessageBytes] = {};

}  // namespace

tagmem_status record_c_error(tagmem_status code, const char* message) noexcept {
  if (message == nullptr) message = "";
  std::size_t n = std::strlen(message);
  if (n < kMessageBytes) {
    std::memcpy(t_text, message, n + 1);
  } else {
    constexpr char kCut[] = "...";
    std::size_t keep = kMessageBytes - sizeof kCut;
    std::memcpy(t_text, message, keep);
    std::memcpy(t_text + keep, kCut, sizeof kCut);
  }
  return code;
}

tagmem_status record_c_error(tagmem_status code, const std::string& message) noexcept {
  return record_c_error(code, message.c_str());
}

const char* last_c_error() noexcept { return t_text; }

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
