// options_test.cpp — the table of TAGMEM_* settings (allocator/options/options.def): tagmem_init
// refuses a bad value of any setting in it with INVALID_ARGUMENT naming the variable and the
// value; tagmem_config_describe reports each setting's value and origin; an unknown TAGMEM_*
// name is warned about once; README's configuration table is the table's allocator part.
#include "options/options.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class Options : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error(); }
  void TearDown() override { EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error(); }
};

std::string describe() {
  std::size_t needed = 0;
  EXPECT_EQ(tagmem_config_describe(nullptr, 0, &needed), TAGMEM_SUCCESS) << tagmem_last_error();
  std::string text(needed, '\0');
  EXPECT_EQ(tagmem_config_describe(text.data(), text.size(), &needed), TAGMEM_SUCCESS);
  EXPECT_EQ(needed, text.size());
  text.resize(text.size() - 1);
  return text;
}

struct described {
  std::string origin, value;
};

std::map<std::string, described> describe_by_name() {
  std::map<std::string, described> out;
  std::istringstream lines(describe());
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name, origin, value;
    fields >> name >> origin >> std::ws;
    std::getline(fields, value);
    EXPECT_TRUE(out.emplace(name, described{origin, value}).second) << "twice: " << name;
  }
  return out;
}

// A value of the right shape that check_option refuses, for each kind that can refuse one.
std::vector<std::string> bad_values(const option_spec& s, std::mt19937_64& rng) {
  const std::string noise = std::to_string(rng() % 1000);
  switch (s.kind) {
    case option_kind::size:
      return {noise + "X", "-" + noise, noise + ".3B", std::to_string(s.high) + "1"};
    case option_kind::integer:
      return {noise + "x", "-1", std::to_string(s.high + 1), noise + ".0"};
    case option_kind::choice:
      return {"x" + noise, std::string(s.choices)};
    default:
      return {};
  }
}

TEST_F(Options, InitRefusesABadValueOfEverySettingNamingVariableAndValue) {
  auto rng = rng_for_test();
  int refused = 0;
  for (const option_spec& s : kOptions) {
    for (const std::string& value : bad_values(s, rng)) {
      scoped_env env(s.name, value.c_str());
      const tagmem_status st = tagmem_init(nullptr);
      ASSERT_EQ(st, TAGMEM_ERROR_INVALID_ARGUMENT) << s.name << "='" << value << "'";
      const std::string message = tagmem_last_error();
      EXPECT_NE(message.find(std::string(s.name) + "='" + value + "'"), std::string::npos)
          << message;
      EXPECT_EQ(describe_by_name()[s.name].origin, "invalid") << s.name << "='" << value << "'";
      ++refused;
    }
  }
  EXPECT_GT(refused, 40);
}

TEST_F(Options, SizesReadTheSameEverywhere) {
  // "2MB" is 2,000,000 bytes, no multiple of 2 MiB (the core used to read it as 2 MiB).
  scoped_env env("TAGMEM_CHUNK_BYTES", "2MB");
  EXPECT_EQ(tagmem_init(nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("a multiple of 2 MiB"), std::string::npos)
      << tagmem_last_error();
  scoped_env fraction("TAGMEM_CHUNK_BYTES", "0.5GiB");
  TAGMEM_OK(tagmem_init(nullptr));
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 4096, "half", 0, nullptr));
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("half", 0, &s));
  EXPECT_EQ(s.mapped_bytes, 512u << 20);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Options, DescribeReportsValuesAndWhereEachCameFrom) {
  auto rng = rng_for_test();
  const std::string streams = std::to_string(1 + rng() % 16);
  const std::string unknown = "TAGMEM_NOT_A_SETTING_" + std::to_string(rng() % 100000);
  scoped_env a("TAGMEM_COPY_STREAMS", streams.c_str());
  scoped_env b(unknown.c_str(), "7");
  scoped_env c("TAGMEM_CHUNK_BYTES", "4MiB");
  unsetenv("TAGMEM_HOST_SLAB_BYTES");
  unsetenv("TAGMEM_ARENA_BYTES");
  auto d = describe_by_name();
  EXPECT_EQ(d.size(), kOptionCount + unknown_environment_names().size());
  EXPECT_EQ(d["TAGMEM_COPY_STREAMS"].origin, "environment");
  EXPECT_EQ(d["TAGMEM_COPY_STREAMS"].value, streams);
  EXPECT_EQ(d["TAGMEM_HOST_SLAB_BYTES"].origin, "default");
  EXPECT_EQ(d["TAGMEM_HOST_SLAB_BYTES"].value, "256 MiB");
  EXPECT_EQ(d[unknown].origin, "unknown");
  EXPECT_EQ(d[unknown].value, "7");

  // After tagmem_init, a tagmem_config field is named as the origin of the value in effect.
  tagmem_config config;
  tagmem_config_init(&config);
  config.arena_bytes = (1 + rng() % 64) << 30;
  {
    ::testing::internal::CaptureStderr();  // the unknown name's warning
    TAGMEM_OK(tagmem_init(&config));
    (void)::testing::internal::GetCapturedStderr();
  }
  d = describe_by_name();
  EXPECT_EQ(d["TAGMEM_ARENA_BYTES"].origin, "tagmem_config.arena_bytes");
  EXPECT_EQ(d["TAGMEM_ARENA_BYTES"].value, format_size(config.arena_bytes));
  EXPECT_EQ(d["TAGMEM_CHUNK_BYTES"].origin, "environment");
  EXPECT_EQ(d["TAGMEM_CHUNK_BYTES"].value, "4MiB");

  // Too small a buffer: INVALID_ARGUMENT, the size needed, nothing written.
  std::size_t needed = 0;
  std::string small(16, 'x');
  EXPECT_EQ(tagmem_config_describe(small.data(), small.size(), &needed),
            TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(needed, describe().size() + 1);
  EXPECT_EQ(small, std::string(16, 'x'));
  EXPECT_EQ(tagmem_config_describe(nullptr, 8, &needed), TAGMEM_ERROR_INVALID_ARGUMENT);
}

TEST_F(Options, AnUnknownNameIsWarnedAboutOnce) {
  auto rng = rng_for_test();
  const std::string unknown = "TAGMEM_CHUNK_BYTE_" + std::to_string(rng() % 100000);
  scoped_env env(unknown.c_str(), "4MiB");
  forget_unknown_warning_for_testing();
  ::testing::internal::CaptureStderr();
  TAGMEM_OK(tagmem_init(nullptr));
  TAGMEM_OK(tagmem_shutdown());
  TAGMEM_OK(tagmem_init(nullptr));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find(" " + unknown), std::string::npos) << err;
  EXPECT_EQ(err.find("TAGMEM_COPY_STREAMS"), std::string::npos) << err;
}

// README's table, row by row, is the table's allocator settings: the name, the default as the
// documentation writes it, the one line of meaning.
TEST(OptionsReadme, TheConfigurationTableIsTheOptionsTable) {
  std::string expected;
  for (const option_spec& s : kOptions) {
    if (s.scope != option_scope::allocator) continue;
    std::string shown = shown_default(s);
    if (*s.default_text && (s.kind == option_kind::text || s.kind == option_kind::choice))
      shown = "`" + shown + "`";
    expected += std::string("| `") + s.name + "` | " + shown + " | " + s.doc + " |\n";
  }
  std::ifstream readme(TAGMEM_SOURCE_DIR "/README.md");
  ASSERT_TRUE(readme) << TAGMEM_SOURCE_DIR "/README.md";
  std::string line, actual;
  bool in_table = false;
  while (std::getline(readme, line)) {
    if (line == "| variable | default | meaning |") {
      in_table = true;
    } else if (in_table && line.rfind("| `TAGMEM_", 0) == 0) {
      actual += line + "\n";
    } else if (in_table && line != "| --- | --- | --- |") {
      break;
    }
  }
  EXPECT_EQ(actual, expected) << "README.md's configuration table should read:\n" << expected;
}

}  // namespace
}  // namespace tagmem::test
