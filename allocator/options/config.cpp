// config.cpp — the configuration tagmem runs with, from tagmem_config and the TAGMEM_* settings
// (see config.hpp; the settings' types, defaults and ranges are in options/options.def).
#include "options/config.hpp"

#include <string>
#include <vector>

#include "base/error.hpp"
#include "options/options.hpp"

namespace tagmem {
namespace {

// Sets `field` from the user's field when non-zero, else from the setting; returns how a message
// names where the value came from, with the value as given.
std::string take(std::size_t& field, std::size_t user, const char* user_name, option o,
                 std::vector<config_field>& fields) {
  const option_spec& s = spec_of(o);
  if (user) {
    field = user;
    fields.push_back({o, user_name, user});
    return std::string("tagmem_config.") + user_name + "=" + std::to_string(user);
  }
  field = option_number(o);
  if (const char* text = option_env(o)) return std::string(s.name) + "='" + text + "'";
  return std::string("the default ") + s.name + "=" + std::to_string(field);
}

// Refuses a tagmem_config field outside its setting's range, naming the field and its value.
// (A variable's value was checked by option_number.)
void check_field(const std::string& origin, option o, std::size_t value) {
  const option_spec& s = spec_of(o);
  const bool ok = value >= s.low && value <= s.high && (s.multiple == 0 || value % s.multiple == 0);
  TAGMEM_EXPECTS(ok, TAGMEM_ERROR_INVALID_ARGUMENT,
                 origin + ": expected " +
                     (s.multiple ? "a multiple of " + format_size(s.multiple) + " " : "") +
                     "from " + format_size(s.low) + " to " + format_size(s.high));
}

}  // namespace

config make_config(const tagmem_config* user) {
  tagmem_config zero{};
  if (!user) user = &zero;  // the C ABI read the caller's struct at its size (Note [sized structs])
  note_config_fields({});   // until this configuration is made, no field is in effect
  // Every setting of the table, the shim's and NCCL's included, so that init reports them.
  check_environment();
  config c;
  std::vector<config_field> fields;
  const std::string chunk =
      take(c.chunk_bytes, user->chunk_bytes, "chunk_bytes", option::CHUNK_BYTES, fields);
  const std::string arena =
      take(c.arena_bytes, user->arena_bytes, "arena_bytes", option::ARENA_BYTES, fields);
  const std::string piece = take(c.copy_piece_bytes, user->copy_piece_bytes, "copy_piece_bytes",
                                 option::COPY_PIECE_BYTES, fields);
  const std::string mapping = take(c.max_mapping_bytes, user->max_mapping_bytes,
                                   "max_mapping_bytes", option::MAX_MAPPING_BYTES, fields);
  const std::string host_max = take(c.host_max_bytes, user->host_max_bytes, "host_max_bytes",
                                    option::HOST_MAX_BYTES, fields);
  c.host_slab_bytes = option_number(option::HOST_SLAB_BYTES);
  c.discard_mapping_bytes = option_number(option::DISCARD_MAPPING_BYTES);
  c.disk_piece_bytes = option_number(option::DISK_PIECE_BYTES);
  c.disk_file_bytes = option_number(option::DISK_FILE_BYTES);
  c.disk_depth = static_cast<int>(option_number(option::DISK_DEPTH));
  c.copy_streams = static_cast<int>(option_number(option::COPY_STREAMS));
  c.metadata = option_choice(option::METADATA) == 0 ? metadata_allocator::mimalloc
                                                    : metadata_allocator::system;
  c.background_release = option_choice(option::DISCARD_RELEASE) == 0;
  c.swap_background_release = option_choice(option::SWAP_RELEASE) == 0;
  c.recycle = static_cast<recycling>(option_choice(option::RECYCLE_PHYSICAL));
  c.pin_ahead = option_choice(option::PIN_AHEAD) == 0;
  c.copy_kernel = static_cast<copy_kernel_use>(option_choice(option::COPY_KERNEL));
  c.handoff = option_choice(option::HANDOFF) == 1;
  c.handoff_after_offload = option_choice(option::HANDOFF_ANNOUNCE) == 0;
  c.handoff_wait_ms = static_cast<int>(option_number(option::HANDOFF_WAIT_MS));
  c.handoff_hold_ms = static_cast<int>(option_number(option::HANDOFF_HOLD_MS));
  c.handoff_map_ahead = option_choice(option::HANDOFF_MAP_AHEAD) == 0;
  c.handoff_timeout_ms = static_cast<int>(option_number(option::HANDOFF_TIMEOUT_MS));
  c.handoff_give_way = option_choice(option::HANDOFF_GIVE_WAY) == 0;
  c.offload_return_queued = option_choice(option::OFFLOAD_RETURN) == 1;
  c.discard_access_per_run = option_choice(option::DISCARD_ACCESS) == 1;
  c.ipc = option_choice(option::IPC) == 1;
  check_field(chunk, option::CHUNK_BYTES, c.chunk_bytes);
  check_field(arena, option::ARENA_BYTES, c.arena_bytes);
  TAGMEM_EXPECTS(c.arena_bytes >= c.chunk_bytes, TAGMEM_ERROR_INVALID_ARGUMENT,
                 arena + ": must be at least the chunk size (" + chunk + ")");
  check_field(mapping, option::MAX_MAPPING_BYTES, c.max_mapping_bytes);
  check_field(piece, option::COPY_PIECE_BYTES, c.copy_piece_bytes);
  if (c.host_max_bytes != 0) check_field(host_max, option::HOST_MAX_BYTES, c.host_max_bytes);
  note_config_fields(std::move(fields));
  return c;
}

}  // namespace tagmem
