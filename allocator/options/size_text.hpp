// size_text.hpp — the one reading of a byte size that a person wrote, for every TAGMEM_* size,
// the emulated driver's device sizes and the benchmarks' options. Header-only, so that the
// emulated driver (a library of its own) compiles the same code as libtagmem.
//
// A size is decimal digits, an optional fraction (".5"), then an optional unit:
//   nothing or "B"                       bytes
//   "KiB" "MiB" "GiB" "TiB", "K" "M" "G" "T"   powers of two (1024, 1024^2, ...)
//   "KB" "MB" "GB" "TB"                  powers of ten (1000, 1000^2, ...)
// The unit's letter may be lower case ("kB", "4m"); nothing else may follow, and no space, sign or
// exponent is read. A fraction must come to a whole number of bytes ("1.5KiB" is 1536, "1.3KiB"
// is refused), and a value beyond 2^64 - 1 is refused rather than wrapped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tagmem {

struct parsed_size {
  bool ok = false;
  std::uint64_t bytes = 0;
  const char* why = "";  // when !ok: how a message goes on after "NAME='text' "
};

inline parsed_size parse_size(std::string_view text) noexcept {
  parsed_size out;
  out.why = "is not a size";
  std::size_t i = 0;
  auto digit = [&](std::size_t at) {
    return at < text.size() && text[at] >= '0' && text[at] <= '9';
  };
  if (!digit(0)) return out;
  unsigned __int128 whole = 0;
  for (; digit(i); ++i) {
    whole = whole * 10 + static_cast<unsigned>(text[i] - '0');
    if (whole > UINT64_MAX) {
      out.why = "is too large";
      return out;
    }
  }
  unsigned __int128 fraction = 0, fraction_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (!digit(i)) return out;
    for (; digit(i); ++i) {
      if (fraction_scale >= 1'000'000'000'000'000'000ull) return out;  // 19 digits are plenty
      fraction = fraction * 10 + static_cast<unsigned>(text[i] - '0');
      fraction_scale *= 10;
    }
  }
  std::string_view unit = text.substr(i);
  std::uint64_t scale = 1;
  if (!unit.empty() && unit != "B") {
    const char prefix = unit[0];
    const std::string_view rest = unit.substr(1);
    int power = 0;
    switch (prefix) {
      case 'k':
      case 'K':
        power = 1;
        break;
      case 'm':
      case 'M':
        power = 2;
        break;
      case 'g':
      case 'G':
        power = 3;
        break;
      case 't':
      case 'T':
        power = 4;
        break;
      default:
        return out;
    }
    std::uint64_t base = 0;
    if (rest.empty() || rest == "iB") {
      base = 1024;
    } else if (rest == "B") {
      base = 1000;
    } else {
      return out;
    }
    for (int p = 0; p < power; ++p) scale *= base;
  }
  const unsigned __int128 bytes = whole * scale;
  const unsigned __int128 part = fraction * scale;
  if (part % fraction_scale != 0) {
    out.why = "is not a whole number of bytes";
    return out;
  }
  const unsigned __int128 total = bytes + part / fraction_scale;
  if (total > UINT64_MAX) {
    out.why = "is too large";
    return out;
  }
  out.ok = true;
  out.bytes = static_cast<std::uint64_t>(total);
  out.why = "";
  return out;
}

// `bytes` as a person writes it: the largest binary unit that divides it ("2 MiB", "256 GiB"),
// else a number of bytes ("1000 B"). parse_size reads it back without the space.
inline std::string format_size(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    const int shift = 10 * (4 - i);
    const std::uint64_t unit = std::uint64_t{1} << shift;
    if (bytes != 0 && bytes % unit == 0) return std::to_string(bytes >> shift) + " " + kUnits[i];
  }
  return std::to_string(bytes) + " B";
}

}  // namespace tagmem
