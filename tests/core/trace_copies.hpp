// trace_copies.hpp — which copy streams carried a tag's device-to-host pieces, read from a trace
// file (TAGMEM_TRACE, docs/observe.md): for tests that check how an offload spreads its copies.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>

namespace tagmem::test {

// The D2H streams (trace tracks) that copied `tag`'s pieces, each with how many it copied.
inline std::map<std::string, std::size_t> d2h_tracks(const std::string& path,
                                                     const std::string& tag) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::regex copy(
      R"re(\{"name":"copy D2H","cat":"copy","ph":"X","ts":[0-9.]+,"dur":[0-9.]+,"pid":[0-9]+,)re"
      R"re("tid":([0-9]+),"args":\{"tag":"([^"]*)")re");
  std::map<std::string, std::size_t> tracks;
  for (std::sregex_iterator it(text.begin(), text.end(), copy), end; it != end; ++it) {
    if ((*it)[2] == tag) ++tracks[(*it)[1]];
  }
  return tracks;
}

}  // namespace tagmem::test
