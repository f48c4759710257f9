// options.cpp — reading, checking and describing the TAGMEM_* settings (see options.hpp).
#include "options/options.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "base/error.hpp"

namespace tagmem {
namespace {

std::atomic<bool> g_warned{false};
// Bit i: option i's value was put in the environment by this process (note_option_chosen_here).
std::atomic<std::uint64_t> g_chosen_here{0};
static_assert(kOptionCount <= 64, "g_chosen_here has a bit per option");
std::mutex g_fields_mutex;
std::vector<config_field> g_fields;  // guarded by g_fields_mutex

// The checked value of `o`: the variable's, else the default's.
checked_option value_of(option o) {
  const option_spec& s = spec_of(o);
  const char* text = option_env(o);
  if (!text) text = s.default_text;
  if (!*text) return {true, 0, ""};  // unset, and no default: the reader decides
  checked_option c = check_option(s, text);
  if (!c.ok) fail(TAGMEM_ERROR_INVALID_ARGUMENT, c.message);
  return c;
}

void expect_kind(option o, option_kind kind) {
  TAGMEM_EXPECTS(spec_of(o).kind == kind, TAGMEM_ERROR_INTERNAL,
                 std::string(spec_of(o).name) + " read as a setting of another kind");
}

}  // namespace

const char* option_env(option o) noexcept {
  const char* v = std::getenv(spec_of(o).name);
  return v && *v ? v : nullptr;
}

std::uint64_t option_number(option o) {
  const option_kind k = spec_of(o).kind;
  TAGMEM_EXPECTS(k == option_kind::size || k == option_kind::integer, TAGMEM_ERROR_INTERNAL,
                 std::string(spec_of(o).name) + " read as a number");
  return value_of(o).number;
}

int option_choice(option o) {
  expect_kind(o, option_kind::choice);
  return static_cast<int>(value_of(o).number);
}

const char* option_text(option o) {
  expect_kind(o, option_kind::text);
  const char* v = option_env(o);
  return v ? v : spec_of(o).default_text;
}

bool option_flag(option o) {
  expect_kind(o, option_kind::flag);
  return value_of(o).number != 0;
}

void check_environment() {
  for (std::size_t i = 0; i < kOptionCount; ++i) (void)value_of(static_cast<option>(i));
  const std::vector<std::string> unknown = unknown_environment_names();
  if (unknown.empty() || g_warned.exchange(true)) return;
  std::string line = "tagmem: ignoring TAGMEM_* variables that are not settings:";
  for (const std::string& n : unknown) line += " " + n;
  std::fprintf(stderr, "%s\n", line.c_str());
}

std::vector<std::string> unknown_environment_names() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry = *e;
    if (entry.rfind("TAGMEM_", 0) != 0) continue;
    const std::string name(entry.substr(0, entry.find('=')));
    if (!find_option(name)) out.push_back(name);
  }
  return out;
}

void note_config_fields(std::vector<config_field> fields) {
  std::lock_guard lock(g_fields_mutex);
  g_fields = std::move(fields);
}

std::string describe_options() {
  std::vector<config_field> fields;
  {
    std::lock_guard lock(g_fields_mutex);
    fields = g_fields;
  }
  std::string out;
  auto line = [&](const std::string& name, const std::string& origin, const std::string& value) {
    std::string l = name;
    l.resize(std::max<std::size_t>(l.size() + 1, 32), ' ');
    l += origin;
    l.resize(std::max<std::size_t>(l.size() + 1, 60), ' ');
    out += l + value + "\n";
  };
  for (std::size_t i = 0; i < kOptionCount; ++i) {
    const option o = static_cast<option>(i);
    const option_spec& s = spec_of(o);
    const config_field* field = nullptr;
    for (const config_field& f : fields)
      if (f.which == o) field = &f;
    if (field) {
      line(s.name, std::string("tagmem_config.") + field->field, format_size(field->value));
    } else if (const char* v = option_env(o)) {
      const bool here = g_chosen_here.load() >> i & 1;
      line(s.name,
           !check_option(s, v).ok ? "invalid"
           : here                 ? "chosen-by-tagmem"
                                  : "environment",
           v);
    } else {
      line(s.name, "default", shown_default(s));
    }
  }
  for (const std::string& name : unknown_environment_names()) {
    const char* v = std::getenv(name.c_str());
    line(name, "unknown", v ? v : "");
  }
  return out;
}

void note_option_chosen_here(option o) noexcept {
  g_chosen_here.fetch_or(std::uint64_t{1} << static_cast<std::size_t>(o));
}

void forget_unknown_warning_for_testing() noexcept { g_warned.store(false); }

}  // namespace tagmem
