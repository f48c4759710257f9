// config.cpp — reads tagmem_config and the TAGMEM_* environment (see config.hpp).
#include "config.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "error.hpp"

namespace tagmem {
namespace {

// Parses "123", "64K", "2M", "256G" (binary units).
std::size_t parse_bytes(const char* name, const char* text) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  TAGMEM_EXPECTS(errno == 0 && end != text, TAGMEM_ERROR_INVALID_ARGUMENT,
                 std::string(name) + "='" + text + "' is not a size");
  std::size_t shift = 0;
  switch (*end) {
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    default:
      break;
  }
  TAGMEM_EXPECTS(*end == '\0' || std::strcmp(end, "iB") == 0 || std::strcmp(end, "B") == 0,
                 TAGMEM_ERROR_INVALID_ARGUMENT,
                 std::string(name) + "='" + text + "' is not a size");
  return static_cast<std::size_t>(v) << shift;
}

void take(std::size_t& field, std::size_t user, const char* env) {
  if (user) {
    field = user;
  } else if (const char* text = std::getenv(env); text && *text) {
    field = parse_bytes(env, text);
  }
}

// The value of `env` among two named choices, `fallback` when unset; INVALID_ARGUMENT otherwise.
template <class T>
T choose(const char* env, const std::pair<const char*, T> (&choices)[2], T fallback) {
  const char* text = std::getenv(env);
  if (!text || !*text) return fallback;
  for (const auto& [name, value] : choices) {
    if (std::strcmp(text, name) == 0) return value;
  }
  fail(TAGMEM_ERROR_INVALID_ARGUMENT, std::string(env) + "='" + text + "': expected " +
                                          choices[0].first + " or " + choices[1].first);
}

}  // namespace

config make_config(const tagmem_config* user) {
  tagmem_config zero{};
  if (user) {
    TAGMEM_EXPECTS(user->struct_size == sizeof(tagmem_config), TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tagmem_config.struct_size is wrong: call tagmem_config_init() first");
  } else {
    user = &zero;
  }
  config c;
  take(c.chunk_bytes, user->chunk_bytes, "TAGMEM_CHUNK_BYTES");
  take(c.arena_bytes, user->arena_bytes, "TAGMEM_ARENA_BYTES");
  take(c.copy_piece_bytes, user->copy_piece_bytes, "TAGMEM_COPY_PIECE_BYTES");
  take(c.max_mapping_bytes, user->max_mapping_bytes, "TAGMEM_MAX_MAPPING_BYTES");
  take(c.host_slab_bytes, 0, "TAGMEM_HOST_SLAB_BYTES");
  take(c.host_max_bytes, user->host_max_bytes, "TAGMEM_HOST_MAX_BYTES");
  take(c.discard_mapping_bytes, 0, "TAGMEM_DISCARD_MAPPING_BYTES");
  if (const char* n = std::getenv("TAGMEM_COPY_STREAMS"); n && *n) {
    char* end = nullptr;
    long v = std::strtol(n, &end, 10);
    TAGMEM_EXPECTS(*end == '\0' && v >= 1 && v <= 16, TAGMEM_ERROR_INVALID_ARGUMENT,
                   std::string("TAGMEM_COPY_STREAMS='") + n + "': expected 1 to 16");
    c.copy_streams = static_cast<int>(v);
  }
  c.metadata =
      choose("TAGMEM_METADATA",
             {{"mimalloc", metadata_allocator::mimalloc}, {"system", metadata_allocator::system}},
             c.metadata);
  c.background_release = choose("TAGMEM_DISCARD_RELEASE", {{"background", true}, {"wait", false}},
                                c.background_release);
  c.swap_background_release = choose(
      "TAGMEM_SWAP_RELEASE", {{"background", true}, {"inline", false}}, c.swap_background_release);
  constexpr std::size_t granule = 2ull << 20;  // the driver's granularity is checked per device
  TAGMEM_EXPECTS(c.chunk_bytes % granule == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "chunk_bytes must be a multiple of 2 MiB");
  TAGMEM_EXPECTS(c.arena_bytes % granule == 0 && c.arena_bytes >= c.chunk_bytes,
                 TAGMEM_ERROR_INVALID_ARGUMENT, "arena_bytes must be a multiple of 2 MiB");
  TAGMEM_EXPECTS(c.max_mapping_bytes % granule == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "max_mapping_bytes must be a multiple of 2 MiB");
  TAGMEM_EXPECTS(c.discard_mapping_bytes % granule == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "TAGMEM_DISCARD_MAPPING_BYTES must be a multiple of 2 MiB");
  TAGMEM_EXPECTS(c.copy_piece_bytes >= (1u << 20), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "copy_piece_bytes must be at least 1 MiB");
  TAGMEM_EXPECTS(c.host_slab_bytes >= (1u << 20), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "TAGMEM_HOST_SLAB_BYTES must be at least 1 MiB");
  return c;
}

}  // namespace tagmem
