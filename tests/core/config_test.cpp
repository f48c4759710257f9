// config_test.cpp — every setting is checked when tagmem initialises: a bad TAGMEM_* variable or
// tagmem_config field makes tagmem_init (or the first call, when tagmem initialises itself) fail
// with INVALID_ARGUMENT and a message naming the setting and the value, and nothing is left
// initialised. Good values are taken as given.
#include <cstring>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

struct bad_setting {
  const char* env;
  const char* value;
};

// Each is refused on its own; the comment says why.
const bad_setting kBadEnv[] = {
    {"TAGMEM_CHUNK_BYTES", "0"},                     // every small allocation would fail
    {"TAGMEM_CHUNK_BYTES", "3M"},                    // not a multiple of 2 MiB
    {"TAGMEM_CHUNK_BYTES", "-2M"},                   // strtoull would negate it into a size
    {"TAGMEM_CHUNK_BYTES", " 2M"},                   // not a plain number
    {"TAGMEM_CHUNK_BYTES", "2Mx"},                   // trailing garbage
    {"TAGMEM_CHUNK_BYTES", "2T"},                    // unknown unit
    {"TAGMEM_CHUNK_BYTES", "banana"},                // not a number
    {"TAGMEM_CHUNK_BYTES", "99999999999999999999"},  // beyond 64 bits
    {"TAGMEM_CHUNK_BYTES", "17592186044416G"},       // 2^74 bytes: the shift would wrap
    {"TAGMEM_ARENA_BYTES", "0"},                     // no virtual space at all
    {"TAGMEM_ARENA_BYTES", "1M"},                    // smaller than a chunk
    {"TAGMEM_ARENA_BYTES", "1048576G"},              // 2^50: beyond any address space
    {"TAGMEM_COPY_PIECE_BYTES", "0"},                // no copy would ever progress
    {"TAGMEM_COPY_PIECE_BYTES", "4K"},               // below 1 MiB
    {"TAGMEM_MAX_MAPPING_BYTES", "0"},               // no mapping could be made
    {"TAGMEM_MAX_MAPPING_BYTES", "1M"},              // below the granularity
    {"TAGMEM_DISCARD_MAPPING_BYTES", "0"},           //
    {"TAGMEM_DISCARD_MAPPING_BYTES", "18446744073709551615"},  // SIZE_MAX
    {"TAGMEM_HOST_SLAB_BYTES", "0"},                           // the store could never grow
    {"TAGMEM_HOST_SLAB_BYTES", "16777216G"},                   // 2^54
    {"TAGMEM_COPY_STREAMS", "0"},                              // no stream to copy on
    {"TAGMEM_COPY_STREAMS", "17"},                             //
    {"TAGMEM_COPY_STREAMS", "2x"},                             //
    {"TAGMEM_COPY_STREAMS", "-1"},                             //
    {"TAGMEM_HOST_PIN", "mlock"},                              // unknown method
    {"TAGMEM_HOST_PIN_THREADS", "0"},                          //
    {"TAGMEM_HOST_PIN_THREADS", "4x"},                         // trailing garbage
    {"TAGMEM_METADATA", "jemalloc"},                           //
    {"TAGMEM_DISCARD_RELEASE", "later"},                       //
    {"TAGMEM_SWAP_RELEASE", "never"},                          //
};

bool mentions(const char* message, const std::string& what) {
  return std::strstr(message, what.c_str()) != nullptr;
}

// No tagmem initialised before or after each test, so that every init below is the first.
class Config : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error(); }
  void TearDown() override { EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error(); }
};

TEST_F(Config, BadEnvironmentFailsInitNamingVariableAndValue) {
  for (const bad_setting& b : kBadEnv) {
    scoped_env env(b.env, b.value);
    tagmem_status s = tagmem_init(nullptr);
    EXPECT_EQ(s, TAGMEM_ERROR_INVALID_ARGUMENT)
        << b.env << "='" << b.value << "' gave " << tagmem_status_string(s);
    if (s == TAGMEM_SUCCESS) {
      ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
      continue;
    }
    EXPECT_TRUE(mentions(tagmem_last_error(), b.env) && mentions(tagmem_last_error(), b.value))
        << b.env << "='" << b.value << "': " << tagmem_last_error();
  }
}

TEST_F(Config, BadEnvironmentFailsTheFirstCallWhenTagmemInitialisesItself) {
  scoped_env env("TAGMEM_CHUNK_BYTES", "0");
  void* p = reinterpret_cast<void*>(0x1);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 4096, "lazy", 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(tagmem_last_error(), "TAGMEM_CHUNK_BYTES='0'")) << tagmem_last_error();
  EXPECT_EQ(p, nullptr);
}

TEST_F(Config, BadConfigFieldsFailInitNamingFieldAndValue) {
  struct bad_field {
    std::size_t tagmem_config::*field;
    const char* name;
    std::size_t value;
  };
  const bad_field fields[] = {
      {&tagmem_config::chunk_bytes, "chunk_bytes", 3u << 20},
      {&tagmem_config::chunk_bytes, "chunk_bytes", SIZE_MAX},
      {&tagmem_config::chunk_bytes, "chunk_bytes", std::size_t{1} << 49},
      {&tagmem_config::arena_bytes, "arena_bytes", 1u << 20},
      {&tagmem_config::arena_bytes, "arena_bytes", SIZE_MAX - (2u << 20) + 1},
      {&tagmem_config::copy_piece_bytes, "copy_piece_bytes", 4096},
      {&tagmem_config::copy_piece_bytes, "copy_piece_bytes", SIZE_MAX},
      {&tagmem_config::max_mapping_bytes, "max_mapping_bytes", 3u << 20},
      {&tagmem_config::max_mapping_bytes, "max_mapping_bytes", SIZE_MAX - (2u << 20) + 1},
  };
  for (const bad_field& f : fields) {
    tagmem_config c;
    tagmem_config_init(&c);
    c.*f.field = f.value;
    tagmem_status s = tagmem_init(&c);
    EXPECT_EQ(s, TAGMEM_ERROR_INVALID_ARGUMENT)
        << f.name << "=" << f.value << " gave " << tagmem_status_string(s);
    if (s == TAGMEM_SUCCESS) {
      ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
      continue;
    }
    const std::string named =
        std::string("tagmem_config.") + f.name + "=" + std::to_string(f.value);
    EXPECT_TRUE(mentions(tagmem_last_error(), named)) << named << ": " << tagmem_last_error();
  }
}

TEST_F(Config, GoodValuesAreTakenAsGiven) {
  scoped_env chunk("TAGMEM_CHUNK_BYTES", "4MiB");
  scoped_env streams("TAGMEM_COPY_STREAMS", "3");
  scoped_env threads("TAGMEM_HOST_PIN_THREADS", "2");
  TAGMEM_OK(tagmem_init(nullptr));
  auto rng = rng_for_test();
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 1000, "good", 0, nullptr));
  auto bytes = random_bytes(rng, 1000);
  write_device(p, bytes.data(), bytes.size());
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("good", 0, &s));
  EXPECT_EQ(s.mapped_bytes, 4u << 20);  // one chunk of the configured size
  const char* tags[] = {"good"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(read_device(p, bytes.size()), bytes);
  TAGMEM_OK(tagmem_free(p, nullptr));
  TAGMEM_OK(tagmem_shutdown());

  // A tagmem_config field wins over the variable.
  tagmem_config c;
  tagmem_config_init(&c);
  c.chunk_bytes = 6u << 20;
  TAGMEM_OK(tagmem_init(&c));
  TAGMEM_OK(tagmem_malloc_tagged(&p, 1000, "field", 0, nullptr));
  TAGMEM_OK(tagmem_tag_stats_get("field", 0, &s));
  EXPECT_EQ(s.mapped_bytes, 6u << 20);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

// A setting whose default is "unset" is not unset by 0: 0 is refused, and the message says how.
TEST_F(Config, ZeroHostMaxBytesIsRefusedAndTheMessageSaysToLeaveItUnset) {
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  scoped_env env("TAGMEM_HOST_MAX_BYTES", "0");
  TAGMEM_FAILS_WITH(tagmem_init(nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(tagmem_last_error(), "TAGMEM_HOST_MAX_BYTES='0'")) << tagmem_last_error();
  EXPECT_TRUE(mentions(tagmem_last_error(), "leave it unset")) << tagmem_last_error();
}

}  // namespace
}  // namespace tagmem::test
