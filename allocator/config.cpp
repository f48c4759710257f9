// config.cpp — reads tagmem_config and the TAGMEM_* environment (see config.hpp).
#include "config.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "byte_math.hpp"
#include "error.hpp"
#include "host_pinning.hpp"

namespace tagmem {
namespace {

// Parses "123", "64K", "2M", "256G" (binary units). Signs, spaces and values that do not fit
// a size_t are refused: strtoull would negate "-1" into SIZE_MAX, and a shift would wrap.
std::size_t parse_bytes(const char* name, const char* text) {
  auto not_a_size = [&](const char* why) {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT, std::string(name) + "='" + text + "' " + why);
  };
  if (*text < '0' || *text > '9') not_a_size("is not a size");
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno == ERANGE) not_a_size("is too large");
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
  if (*end != '\0' && std::strcmp(end, "iB") != 0 && std::strcmp(end, "B") != 0) {
    not_a_size("is not a size");
  }
  if (v > (std::numeric_limits<std::size_t>::max() >> shift)) not_a_size("is too large");
  return static_cast<std::size_t>(v) << shift;
}

// Sets `field` from the user's field (when non-zero), else from `env` (when set); returns how a
// message names where the value came from, with the value as given.
std::string take(std::size_t& field, std::size_t user, const char* user_name, const char* env) {
  if (user) {
    field = user;
    return std::string("tagmem_config.") + user_name + "=" + std::to_string(user);
  }
  if (const char* text = std::getenv(env); text && *text) {
    field = parse_bytes(env, text);
    return std::string(env) + "='" + text + "'";
  }
  return std::string("the default ") + user_name + "=" + std::to_string(field);
}

// Refuses a size setting outside [min_bytes, kMaxAddressableBytes] or not a multiple of
// `multiple` (0: any), naming the setting and its value.
void check_size(const std::string& origin, std::size_t value, std::size_t min_bytes,
                std::size_t multiple) {
  const bool ok = value >= min_bytes && value <= kMaxAddressableBytes &&
                  (multiple == 0 || value % multiple == 0);
  TAGMEM_EXPECTS(ok, TAGMEM_ERROR_INVALID_ARGUMENT,
                 origin + ": expected " + (multiple ? "a multiple of 2 MiB " : "") + "from " +
                     std::to_string(min_bytes >> 20) + " MiB to 256 TiB");
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
  const std::string chunk =
      take(c.chunk_bytes, user->chunk_bytes, "chunk_bytes", "TAGMEM_CHUNK_BYTES");
  const std::string arena =
      take(c.arena_bytes, user->arena_bytes, "arena_bytes", "TAGMEM_ARENA_BYTES");
  const std::string piece = take(c.copy_piece_bytes, user->copy_piece_bytes, "copy_piece_bytes",
                                 "TAGMEM_COPY_PIECE_BYTES");
  const std::string mapping = take(c.max_mapping_bytes, user->max_mapping_bytes,
                                   "max_mapping_bytes", "TAGMEM_MAX_MAPPING_BYTES");
  const std::string slab = take(c.host_slab_bytes, 0, "host_slab_bytes", "TAGMEM_HOST_SLAB_BYTES");
  const std::string discard =
      take(c.discard_mapping_bytes, 0, "discard_mapping_bytes", "TAGMEM_DISCARD_MAPPING_BYTES");
  const std::string host_max =
      take(c.host_max_bytes, user->host_max_bytes, "host_max_bytes", "TAGMEM_HOST_MAX_BYTES");
  if (const char* n = std::getenv("TAGMEM_COPY_STREAMS"); n && *n) {
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(n, &end, 10);
    TAGMEM_EXPECTS(errno == 0 && end != n && *end == '\0' && v >= 1 && v <= 16,
                   TAGMEM_ERROR_INVALID_ARGUMENT,
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
  // Read by the host store when it is first used; checked here so that init reports them.
  (void)pin_method_from_env();
  (void)pin_threads_from_env();
  constexpr std::size_t granule = 2ull << 20;  // the driver's granularity is checked per device
  check_size(chunk, c.chunk_bytes, granule, granule);
  check_size(arena, c.arena_bytes, granule, granule);
  TAGMEM_EXPECTS(c.arena_bytes >= c.chunk_bytes, TAGMEM_ERROR_INVALID_ARGUMENT,
                 arena + ": must be at least the chunk size (" + chunk + ")");
  check_size(mapping, c.max_mapping_bytes, granule, granule);
  check_size(discard, c.discard_mapping_bytes, granule, granule);
  check_size(piece, c.copy_piece_bytes, 1u << 20, 0);
  check_size(slab, c.host_slab_bytes, 1u << 20, 0);
  if (c.host_max_bytes != 0)
    check_size(host_max, c.host_max_bytes, 1u << 20, 0);  // 0: the machine's
  return c;
}

}  // namespace tagmem
