// errors_test.cpp — every bad input and resource failure gets a status and a message, changes
// nothing and leaks nothing; a reload that runs out of memory loses nothing.
#include <new>
#include <stdexcept>

#include "api/c_error.hpp"
#include "base/error.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

class Errors : public tagmem_test {};

TEST_F(Errors, UnknownTagsAreReported) {
  const char* tags[] = {"nobody"};
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_UNKNOWN_TAG);
  TAGMEM_FAILS_WITH(tagmem_reload(tags, 1, 0), TAGMEM_ERROR_UNKNOWN_TAG);
  tagmem_tag_stats s{};
  TAGMEM_FAILS_WITH(tagmem_tag_stats_get("nobody", 0, &s), TAGMEM_ERROR_UNKNOWN_TAG);
}

// Note [C boundary] in c_error.hpp: whatever a body throws becomes a status and a message.
TEST_F(Errors, TheCBoundaryTurnsEveryExceptionIntoAStatusAndAMessage) {
  auto rng = rng_for_test();
  const std::string text = "failure " + std::to_string(rng());
  EXPECT_EQ(c_boundary([&] { fail(TAGMEM_ERROR_PEER, text); }), TAGMEM_ERROR_PEER);
  EXPECT_EQ(std::string(tagmem_last_error()), text);
  EXPECT_EQ(c_boundary([] { throw std::bad_alloc(); }), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_EQ(std::string(tagmem_last_error()), "out of host memory for tagmem's records");
  EXPECT_EQ(c_boundary([&] { throw std::logic_error(text); }), TAGMEM_ERROR_INTERNAL);
  EXPECT_EQ(std::string(tagmem_last_error()), "internal error: " + text);
  EXPECT_EQ(c_boundary([] { throw 7; }), TAGMEM_ERROR_INTERNAL);
  EXPECT_EQ(std::string(tagmem_last_error()), "internal error: unknown exception");
  bool ran = false;
  EXPECT_EQ(c_boundary([&] { ran = true; }), TAGMEM_SUCCESS);
  EXPECT_TRUE(ran);
}

TEST_F(Errors, BadArgumentsAreRejected) {
  void* p = reinterpret_cast<void*>(0x1);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 0, "t", 0, nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, SIZE_MAX, "t", 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, std::size_t{1} << 50, "t", 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(nullptr, 16, "t", 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 16, "", 0, nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 16, nullptr, 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 16, "has space", 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  std::string long_name(TAGMEM_MAX_TAG_NAME + 1, 'x');
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 16, long_name.c_str(), 0, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, 16, "t", 4096, nullptr),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_push_tag(""), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_pop_tag(), TAGMEM_ERROR_SCOPE_EMPTY);
  TAGMEM_FAILS_WITH(tagmem_tag_stats_get_sized("t", 0, nullptr, sizeof(tagmem_tag_stats)),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_init(nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);  // already initialised

  void* q = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&q, 16, "t", 0, nullptr));
  const char* tags[] = {"t"};
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, static_cast<tagmem_offload_mode>(7)),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  const char* twice[] = {"t", "t"};
  TAGMEM_FAILS_WITH(tagmem_offload(twice, 2, 0, TAGMEM_BACKUP), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_FAILS_WITH(tagmem_offload(nullptr, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_INVALID_ARGUMENT);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("t", 0, &s));
  EXPECT_EQ(s.state, TAGMEM_RESIDENT);  // none of the rejected calls changed it
  TAGMEM_OK(tagmem_free(q, nullptr));
}

TEST_F(Errors, ConfigurationIsChecked) {
  TAGMEM_OK(tagmem_shutdown());
  tagmem_config c;
  tagmem_config_init(&c);
  c.chunk_bytes = 3 << 20;
  TAGMEM_FAILS_WITH(tagmem_init(&c), TAGMEM_ERROR_INVALID_ARGUMENT);
  tagmem_config d{};  // struct_size not set
  TAGMEM_FAILS_WITH(tagmem_init(&d), TAGMEM_ERROR_INVALID_ARGUMENT);
  tagmem_config_init(&c);
  c.chunk_bytes = 4 << 20;
  TAGMEM_OK(tagmem_init(&c));
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 100, "cfg", 0, nullptr));
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("cfg", 0, &s));
  EXPECT_EQ(s.mapped_bytes, 4u << 20);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Errors, StateErrorsChangeNothing) {
  auto rng = rng_for_test();
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 1 << 20, "state", 0, nullptr));
  auto bytes = random_bytes(rng, 1 << 20);
  write_device(p, bytes.data(), bytes.size());
  const char* tags[] = {"state"};
  TAGMEM_FAILS_WITH(tagmem_reload(tags, 1, 0), TAGMEM_ERROR_TAG_RESIDENT);
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_TAG_OFFLOADED);
  TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD), TAGMEM_ERROR_TAG_OFFLOADED);
  void* q = nullptr;
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&q, 64, "state", 0, nullptr), TAGMEM_ERROR_TAG_OFFLOADED);
  TAGMEM_FAILS_WITH(tagmem_swap(tags, 1, nullptr, 0, 0, TAGMEM_BACKUP), TAGMEM_ERROR_TAG_OFFLOADED);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("state", 0, &s));
  EXPECT_EQ(s.state, TAGMEM_OFFLOADED_BACKUP);  // the DISCARD attempt did not drop the backup
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(read_device(p, bytes.size()), bytes);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(Errors, BadFreesAreReported) {
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 4096, "frees", 0, nullptr));
  int on_stack = 0;
  TAGMEM_FAILS_WITH(tagmem_free(&on_stack, nullptr), TAGMEM_ERROR_UNKNOWN_POINTER);
  TAGMEM_FAILS_WITH(tagmem_free(static_cast<char*>(p) + 256, nullptr),
                    TAGMEM_ERROR_UNKNOWN_POINTER);
  TAGMEM_OK(tagmem_free(p, nullptr));
  TAGMEM_FAILS_WITH(tagmem_free(p, nullptr), TAGMEM_ERROR_UNKNOWN_POINTER);
  TAGMEM_FAILS_WITH(tagmem_free(nullptr, nullptr), TAGMEM_ERROR_UNKNOWN_POINTER);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("frees", 0, &s));
  EXPECT_EQ(s.free_count, 1u);
  EXPECT_EQ(s.live_allocations, 0u);
}

TEST_F(Errors, AllocationBeyondFreeMemoryFailsWithoutLeaking) {
  // Ballast first, so that free memory plus a little is still no larger than the device.
  void* ballast = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&ballast, 64 << 20, "ballast", 0, nullptr));
  std::size_t free_before = device_free_bytes();
  ASSERT_GT(free_before, 64u << 20);
  void* p = reinterpret_cast<void*>(0x1);
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, free_before + (32u << 20), "hog", 0, nullptr),
                    TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(p, nullptr);
  EXPECT_NEAR(device_free_bytes(), free_before, free_memory_noise());
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("hog", 0, &s));
  EXPECT_EQ(s.mapped_bytes, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  TAGMEM_OK(tagmem_free(ballast, nullptr));
}

TEST_F(Errors, ReloadOutOfMemoryKeepsTheBackupAndSucceedsOnceMemoryIsFreed) {
  auto rng = rng_for_test();
  const std::size_t n = 64 << 20;
  void* victim = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&victim, n, "victim", 0, nullptr));
  auto bytes = random_bytes(rng, n);
  write_device(victim, bytes.data(), n);
  const char* tags[] = {"victim"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  tagmem_tag_stats off{};
  TAGMEM_OK(tagmem_tag_stats_get("victim", 0, &off));

  // Take all but 32 MiB of the device: the 66 MiB reload cannot fit.
  std::size_t free_now = device_free_bytes();
  ASSERT_GT(free_now, 256u << 20);
  std::size_t hog_size = (free_now - (32u << 20)) / (2u << 20) * (2u << 20);
  void* hog = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&hog, hog_size, "hog", 0, nullptr));
  std::size_t free_full = device_free_bytes();

  TAGMEM_FAILS_WITH(tagmem_reload(tags, 1, 0), TAGMEM_ERROR_OUT_OF_MEMORY);
  tagmem_tag_stats still{};
  TAGMEM_OK(tagmem_tag_stats_get("victim", 0, &still));
  EXPECT_EQ(still.state, TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(still.host_bytes, off.host_bytes);
  EXPECT_EQ(still.mapped_bytes, 0u);
  EXPECT_NEAR(device_free_bytes(), free_full,
              free_memory_noise());  // the failed reload left nothing mapped

  TAGMEM_OK(tagmem_free(hog, nullptr));
  TAGMEM_OK(tagmem_empty_cache(0));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(read_device(victim, n), bytes);
  TAGMEM_OK(tagmem_free(victim, nullptr));
}

TEST_F(Errors, ShutdownReleasesEverythingAndTagmemStartsAgain) {
  std::size_t free_before = device_free_bytes();
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 64 << 20, "leaked_by_caller", 0, nullptr));
  const char* tags[] = {"leaked_by_caller"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_shutdown());
  TAGMEM_OK(tagmem_init(nullptr));
  EXPECT_NEAR(device_free_bytes(), free_before, free_memory_noise());
  tagmem_tag_stats s{};
  TAGMEM_FAILS_WITH(tagmem_tag_stats_get("leaked_by_caller", 0, &s), TAGMEM_ERROR_UNKNOWN_TAG);
}

}  // namespace
}  // namespace tagmem::test
