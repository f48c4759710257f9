// options.hpp — the TAGMEM_* settings as libtagmem, the LD_PRELOAD shim and the NCCL integration
// read them: through the one table (options/options.def), with the one check (option_table.hpp).
//
// A setting is read from the environment when it is used: tagmem_init reads the allocator's
// (config.cpp) and checks every other one too, so that a bad value anywhere fails init with
// INVALID_ARGUMENT naming the variable and the value; settings used before tagmem_init (the
// driver's path, the shim's, NCCL's) go through the same accessors and fail the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "options/option_table.hpp"

namespace tagmem {

// The variable's value, or nullptr when unset or empty (empty counts as unset everywhere).
const char* option_env(option o) noexcept;

// The value in effect: the variable's when set, else the default. Throws INVALID_ARGUMENT (the
// message names the variable and the value) when the variable does not pass check_option.
std::uint64_t option_number(option o);  // size or integer; 0 when unset without a default
int option_choice(option o);            // choice: the index in its '|'-separated list
const char* option_text(option o);      // text: "" when unset without a default
bool option_flag(option o);             // flag

// Checks every setting of the table that is set in the environment; throws the first bad one.
// Then warns once per process, in one line on stderr, about TAGMEM_* variables the table does
// not know (a misspelt setting would otherwise be ignored without a word).
void check_environment();

// The TAGMEM_* names in the environment that the table does not know, in environment order.
std::vector<std::string> unknown_environment_names();

// A tagmem_config field that overrode a variable in the last configuration made.
struct config_field {
  option which;
  const char* field;  // "chunk_bytes"
  std::uint64_t value;
};

// Records the fields of the configuration just made (replacing those of the last one).
void note_config_fields(std::vector<config_field> fields);

// Says that this process itself put `o`'s value in its environment (peers/private_dir.cpp picks
// the rendezvous directory at load time for the processes it starts), so that describe_options
// tells it from a value the user gave.
void note_option_chosen_here(option o) noexcept;

// One line per setting of the table, then one per unknown TAGMEM_* variable:
//   NAME ORIGIN VALUE
// ORIGIN is default, environment, chosen-by-tagmem (note_option_chosen_here),
// tagmem_config.<field>, invalid (set, but refused by check_option) or unknown; VALUE is the value
// as given, or the default as documented.
std::string describe_options();

// For tests: the unknown-name warning may be given again.
void forget_unknown_warning_for_testing() noexcept;

}  // namespace tagmem
