// sized_struct.hpp — the structs of the C ABI at the size their caller was built with.
//
// Note [sized structs]: a struct that crosses the C ABI grows only at its end, and every call
// that takes one also takes the size the caller's header gave it (tagmem_config carries it in
// struct_size; the statistics calls take it as an argument, which tagmem.h's macros fill with
// sizeof). The library reads and writes no byte past that size, so a program built against an
// older header, whose struct is a prefix of today's, gets exactly its prefix:
//  - a size below the struct's first released size (first_size) cannot be a prefix of any
//    version, and one above kLargestStruct is not a size at all (an uninitialised struct_size):
//    both are INVALID_ARGUMENT, and nothing is read or written;
//  - out: the library's struct is written up to the caller's size, and what a newer caller has
//    beyond the library's struct is zeroed (fields this library does not know read as 0);
//  - in: the caller's bytes up to its size are read; what the library does not know must be 0,
//    else INVALID_ARGUMENT (a setting this library would silently ignore).
// docs/abi.md is the policy built on this.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "base/error.hpp"

namespace tagmem {

// Larger than any struct of the ABI will grow to; a struct_size beyond it is garbage.
inline constexpr std::size_t kLargestStruct = 4096;

inline void check_struct_size(std::size_t size, std::size_t first_size, std::size_t ours,
                              const char* what) {
  TAGMEM_EXPECTS(size >= first_size && size <= kLargestStruct, TAGMEM_ERROR_INVALID_ARGUMENT,
                 std::string(what) + ": size " + std::to_string(size) + " is not the size of any " +
                     what + " (this library's is " + std::to_string(ours) + ", the first was " +
                     std::to_string(first_size) +
                     "): build against tagmem.h and pass sizeof, as its macros do");
}

// Writes `value` to `out`, a caller's struct of `out_size` bytes.
template <class T>
void write_sized(const T& value, void* out, std::size_t out_size, std::size_t first_size,
                 const char* what) {
  static_assert(std::is_trivially_copyable_v<T>);
  TAGMEM_EXPECTS(out != nullptr, TAGMEM_ERROR_INVALID_ARGUMENT, "out is NULL");
  check_struct_size(out_size, first_size, sizeof(T), what);
  std::memcpy(out, &value, std::min(out_size, sizeof(T)));
  if (out_size > sizeof(T))
    std::memset(static_cast<char*>(out) + sizeof(T), 0, out_size - sizeof(T));
}

// Reads a caller's struct of `in_size` bytes into a T whose fields past the caller's are zero.
template <class T>
T read_sized(const void* in, std::size_t in_size, std::size_t first_size, const char* what) {
  static_assert(std::is_trivially_copyable_v<T>);
  check_struct_size(in_size, first_size, sizeof(T), what);
  T value{};
  std::memcpy(&value, in, std::min(in_size, sizeof(T)));
  const char* rest = static_cast<const char*>(in);
  for (std::size_t i = sizeof(T); i < in_size; ++i) {
    TAGMEM_EXPECTS(rest[i] == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                   std::string(what) + ": the caller's struct (" + std::to_string(in_size) +
                       " bytes) sets byte " + std::to_string(i) + ", past the " +
                       std::to_string(sizeof(T)) + " this library knows: a newer setting it " +
                       "cannot honour");
  }
  return value;
}

}  // namespace tagmem
