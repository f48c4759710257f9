// json_text.hpp — writing JSON strings: the trace's events and the benchmarks' result files.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace tagmem {

// `text` as a JSON string literal, quotes included (control bytes as \u escapes).
inline std::string json_quoted(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace tagmem
