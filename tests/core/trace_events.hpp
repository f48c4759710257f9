// trace_events.hpp — what tests read back from a trace file (TAGMEM_TRACE, docs/observe.md): the
// copy streams that carried a tag's device-to-host pieces, and the bytes of named spans and
// counters.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace tagmem::test {

// The whole file at `path` (empty, with a test failure, when it cannot be read).
inline std::string trace_text(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The D2H streams (trace tracks) that copied `tag`'s pieces, each with how many it copied.
inline std::map<std::string, std::size_t> d2h_tracks(const std::string& path,
                                                     const std::string& tag) {
  const std::string text = trace_text(path);
  const std::regex copy(
      R"re(\{"name":"copy D2H","cat":"copy","ph":"X","ts":[0-9.]+,"dur":[0-9.]+,"pid":[0-9]+,)re"
      R"re("tid":([0-9]+),"args":\{"tag":"([^"]*)")re");
  std::map<std::string, std::size_t> tracks;
  for (std::sregex_iterator it(text.begin(), text.end(), copy), end; it != end; ++it) {
    if ((*it)[2] == tag) ++tracks[(*it)[1]];
  }
  return tracks;
}

// The `bytes` argument of every event `name` of tagmem's own: spans (`counter` false) or counter
// values (`counter` true), in the order of the text.
inline std::vector<std::uint64_t> event_bytes(const std::string& text, const std::string& name,
                                              bool counter) {
  const std::string head = counter ? R"re(","ph":"C",)re" : R"re(","cat":"tagmem","ph":"X",)re";
  const std::regex event(R"re(\{"name":")re" + name + head +
                         R"re([^{]*"args":\{"bytes":([0-9]+)\})re");
  std::vector<std::uint64_t> out;
  for (std::sregex_iterator it(text.begin(), text.end(), event), end; it != end; ++it) {
    out.push_back(std::stoull((*it)[1]));
  }
  return out;
}

}  // namespace tagmem::test
