// option_table.hpp — the table of TAGMEM_* settings built from options.def, and the one check of
// a value against its entry. Header-only, like size_text.hpp, so that the emulated driver reads
// its settings with the same rules as libtagmem. What a value means at run time, where it came
// from and the process-wide view are in allocator/options/options.hpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "size_text.hpp"

namespace tagmem {

enum class option_scope { allocator, emulator, preload, nccl, python, benchmarks };
enum class option_kind { size, integer, choice, text, flag };

struct option_spec {
  const char* name;  // "TAGMEM_CHUNK_BYTES"
  option_scope scope;
  option_kind kind;
  const char* default_text;  // "": unset (shown_unset says what that means)
  std::uint64_t low, high, multiple;
  const char* choices;  // "background|wait"
  const char* shown_unset;
  const char* doc;
};

enum class option : int {
#define TAGMEM_OPTION(id, ...) id,
#include "options.def"
#undef TAGMEM_OPTION
};

inline constexpr option_spec kOptions[] = {
#define TAGMEM_OPTION(id, scope, kind, def, low, high, multiple, choices, shown_unset, doc) \
  {"TAGMEM_" #id,                                                                           \
   option_scope::scope,                                                                     \
   option_kind::kind,                                                                       \
   def,                                                                                     \
   low,                                                                                     \
   high,                                                                                    \
   multiple,                                                                                \
   choices,                                                                                 \
   shown_unset,                                                                             \
   doc},
#include "options.def"
#undef TAGMEM_OPTION
};

inline constexpr std::size_t kOptionCount = sizeof(kOptions) / sizeof(kOptions[0]);

constexpr const option_spec& spec_of(option o) { return kOptions[static_cast<int>(o)]; }

// The entry named `name`, or nullptr.
inline const option_spec* find_option(std::string_view name) {
  for (const option_spec& s : kOptions)
    if (name == s.name) return &s;
  return nullptr;
}

// How the documentation writes the default of `s`: "2 MiB", "background", "min(cores, 16)".
inline std::string shown_default(const option_spec& s) {
  if (!*s.default_text) return s.shown_unset;
  if (s.kind == option_kind::size) return format_size(parse_size(s.default_text).bytes);
  return s.default_text;
}

// The position of `text` among the '|'-separated `choices`, or -1.
inline int choice_index(const char* choices, std::string_view text) {
  int index = 0;
  for (const char* p = choices;; ++index) {
    const char* bar = std::strchr(p, '|');
    const std::size_t n = bar ? static_cast<std::size_t>(bar - p) : std::strlen(p);
    if (text == std::string_view(p, n)) return index;
    if (!bar) return -1;
    p = bar + 1;
  }
}

// A value checked against its entry: for a size or integer its number, for a choice its index,
// for a flag 0 or 1; for text, nothing. `message` (when !ok) names the variable and the value as
// given: "TAGMEM_COPY_STREAMS='17': expected 1 to 16".
struct checked_option {
  bool ok = false;
  std::uint64_t number = 0;
  std::string message;
};

inline checked_option check_option(const option_spec& s, std::string_view text) {
  checked_option out;
  const std::string given = std::string(s.name) + "='" + std::string(text) + "'";
  auto range = [&](auto show) {
    std::string r = show(s.low) + " to " + show(s.high);
    if (s.multiple) r = "a multiple of " + show(s.multiple) + " from " + r;
    return given + ": expected " + r;
  };
  switch (s.kind) {
    case option_kind::size: {
      const parsed_size p = parse_size(text);
      if (!p.ok) {
        out.message = given + " " + p.why +
                      " (a size: 123, 64KiB, 2MiB, 1.5GiB; KB, MB, GB are "
                      "powers of ten)";
        return out;
      }
      if (p.bytes < s.low || p.bytes > s.high || (s.multiple && p.bytes % s.multiple)) {
        out.message = range([](std::uint64_t v) { return format_size(v); });
        if (p.bytes == 0 && !*s.default_text) {
          out.message += " (leave it unset for " + std::string(s.shown_unset) + ")";
        }
        return out;
      }
      out.number = p.bytes;
      break;
    }
    case option_kind::integer: {
      std::uint64_t v = 0;
      bool digits = !text.empty();
      for (char c : text) {
        if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) {
          digits = false;
          break;
        }
        v = v * 10 + static_cast<std::uint64_t>(c - '0');
      }
      if (!digits || v < s.low || v > s.high) {
        out.message = range([](std::uint64_t x) { return std::to_string(x); });
        return out;
      }
      out.number = v;
      break;
    }
    case option_kind::choice: {
      const int i = choice_index(s.choices, text);
      if (i < 0) {
        const std::string_view all = s.choices;
        const std::size_t last = all.rfind('|');
        std::string list;
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (all[i] != '|')
            list += all[i];
          else
            list += i == last ? " or " : ", ";
        }
        out.message = given + ": expected " + list;
        return out;
      }
      out.number = static_cast<std::uint64_t>(i);
      break;
    }
    case option_kind::flag:
      out.number = !text.empty() && text != "0";
      break;
    case option_kind::text:
      break;
  }
  out.ok = true;
  return out;
}

// For readers that cannot fail (the emulated driver, the shim inside a driver call): the checked
// value of the variable, or where it is unset or bad, the default's, after one line on stderr
// ("<who>: TAGMEM_X='y': expected ...; using the default"). tagmem_init refuses the bad value.
inline std::uint64_t number_or_default(const option_spec& s, const char* who) {
  if (const char* text = std::getenv(s.name); text && *text) {
    const checked_option c = check_option(s, text);
    if (c.ok) return c.number;
    std::fprintf(stderr, "%s: %s; using the default\n", who, c.message.c_str());
  }
  return *s.default_text ? check_option(s, s.default_text).number : 0;
}

}  // namespace tagmem
