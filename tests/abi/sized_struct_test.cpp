// The structs of the C ABI at the size the caller states (Note [sized structs] in
// allocator/api/sized_struct.hpp), through the shared library as a program links it: an older
// caller's smaller struct gets its prefix and no byte after it, a newer caller's larger one gets
// zeros past the library's fields, and sizes that are no version's are refused with a message and
// without a byte touched. Every caller-sized struct of docs/abi.md's table is here.
//
// The same binary runs twice (tests/abi/CMakeLists.txt): linked against libtagmem.so, and under
// LD_PRELOAD=libtagmem_preload.so, whose soname is libtagmem's, so that the shim serves every
// tagmem.h call and also tagmem_nccl_stats (tagmem_nccl.h), which only the shim exports and which
// is found with dlsym as its header says. TAGMEM_ABI_LIBRARY names the library each run must be
// served by.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tagmem/tagmem.h"
#include "tagmem/tagmem_nccl.h"

namespace {

constexpr std::size_t kFirstConfig = offsetof(tagmem_config, host_max_bytes);
constexpr std::size_t kFirstTagStats = offsetof(tagmem_tag_stats, peak_allocated_bytes);
constexpr std::size_t kFirstDeviceStats = offsetof(tagmem_device_stats, host_budget_bytes);
// The first released tagmem_nccl_stats ended before this field (integrations/nccl/nccl_c_api.cpp).
constexpr std::size_t kFirstNcclStats = offsetof(tagmem_nccl_stats, backup_store_used_bytes);

// What sizeof gave a caller of a struct's first release: the end of its last field, padded to the
// struct's alignment.
constexpr std::size_t released_size(std::size_t end_of_last, std::size_t align) {
  return (end_of_last + align - 1) / align * align;
}
// tagmem_handoff_stats and tagmem_ipc_stats were sized from their first release, whose last
// fields were `listening` and `open_here`; fields added later do not move these.
constexpr std::size_t kFirstHandoffStats = released_size(
    offsetof(tagmem_handoff_stats, listening) + sizeof(int), alignof(tagmem_handoff_stats));
constexpr std::size_t kFirstIpcStats = released_size(
    offsetof(tagmem_ipc_stats, open_here) + sizeof(uint64_t), alignof(tagmem_ipc_stats));
static_assert(kFirstHandoffStats <= sizeof(tagmem_handoff_stats));
static_assert(kFirstIpcStats <= sizeof(tagmem_ipc_stats));

// Sizes that are no version's of a struct first released at `first` bytes: each is refused.
std::vector<std::size_t> sizes_of_no_version(std::size_t first) {
  return {0, 1, 8, first - 8, first - 1, 4097, std::size_t{1} << 40, SIZE_MAX};
}

// A refused size's buffer: room for any struct, so that a library that wrongly writes one is
// reported (the buffer changed) rather than corrupting the heap.
constexpr std::size_t kRefusedBuffer = 512;
static_assert(kRefusedBuffer >= sizeof(tagmem_config) &&
              kRefusedBuffer >= sizeof(tagmem_tag_stats) &&
              kRefusedBuffer >= sizeof(tagmem_device_stats) &&
              kRefusedBuffer >= sizeof(tagmem_handoff_stats) &&
              kRefusedBuffer >= sizeof(tagmem_ipc_stats) &&
              kRefusedBuffer >= sizeof(tagmem_nccl_stats));

std::string last_error() { return tagmem_last_error(); }

// The file this process resolves `symbol` to, or "" when nothing exports it.
std::string serving_file(const char* symbol) {
  void* f = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (f == nullptr || dladdr(f, &info) == 0 || info.dli_fname == nullptr) return "";
  char real[PATH_MAX];
  return realpath(info.dli_fname, real) ? real : info.dli_fname;
}

// The library under test (TAGMEM_ABI_LIBRARY, set by ctest), resolved; "" when unset.
std::string library_under_test() {
  const char* v = std::getenv("TAGMEM_ABI_LIBRARY");
  if (v == nullptr || *v == '\0') return "";
  char real[PATH_MAX];
  return realpath(v, real) ? real : v;
}

bool under_shim() {
  return std::filesystem::path(library_under_test())
             .filename()
             .string()
             .rfind("libtagmem_preload", 0) == 0;
}

// A caller's struct of `size` bytes followed by guard bytes, all random.
class caller_buffer {
 public:
  caller_buffer(std::size_t size, std::mt19937_64& rng) : size_(size), bytes_(size + 64) {
    for (auto& b : bytes_) b = static_cast<unsigned char>(rng());
    initial_ = bytes_;
  }
  void* data() { return bytes_.data(); }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  bool guard_intact() const {
    return std::memcmp(bytes_.data() + size_, initial_.data() + size_, 64) == 0;
  }
  bool untouched() const { return bytes_ == initial_; }
  bool zero_from(std::size_t from) const {
    for (std::size_t i = from; i < size_; ++i)
      if (bytes_[i] != 0) return false;
    return true;
  }

 private:
  std::size_t size_;
  std::vector<unsigned char> bytes_;
  std::vector<unsigned char> initial_;
};

class SizedStruct : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!peers_) unsetenv("TAGMEM_HANDOFF");  // off, unless the test is a PeerSizedStruct
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    size_ = 4096 + rng_() % 4096;
    ASSERT_EQ(tagmem_malloc_tagged(&p_, size_, "sized", 0, nullptr), TAGMEM_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(tagmem_free(p_, nullptr), TAGMEM_SUCCESS);
    EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  }
  std::mt19937_64 rng_{std::random_device{}()};
  void* p_ = nullptr;
  std::size_t size_ = 0;
  bool peers_ = false;
};

// With a private directory and a job, as handoff and IPC need, and TAGMEM_HANDOFF=on.
class PeerSizedStruct : public SizedStruct {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp == '/' ? tmp : "/tmp") + "/tagmem-abi-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr) << dir;
    dir_ = dir;
    setenv("TAGMEM_PEER_DIR", dir_.c_str(), 1);
    setenv("TAGMEM_JOB", ("abi-sized-" + std::to_string(getpid())).c_str(), 1);
    setenv("TAGMEM_HANDOFF", "on", 1);
    peers_ = true;
    SizedStruct::SetUp();
  }
  void TearDown() override {
    SizedStruct::TearDown();
    for (const char* v : {"TAGMEM_PEER_DIR", "TAGMEM_JOB", "TAGMEM_HANDOFF"}) unsetenv(v);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

// Each run is served by the library it is meant to test: libtagmem.so, or the shim in its place.
TEST(Library, ServesEveryCallItIsMeantTo) {
  const std::string lib = library_under_test();
  ASSERT_FALSE(lib.empty()) << "set TAGMEM_ABI_LIBRARY to the library under test (ctest does)";
  for (const char* f : {"tagmem_init", "tagmem_last_error", "tagmem_config_init_sized",
                        "tagmem_tag_stats_get_sized", "tagmem_device_stats_get_sized",
                        "tagmem_handoff_stats_get_sized", "tagmem_ipc_stats_get_sized"}) {
    EXPECT_EQ(serving_file(f), lib) << f;
  }
  // tagmem_nccl.h is the shim's alone.
  for (const char* f : {"tagmem_nccl_stats_get_sized", "tagmem_nccl_stats_get"}) {
    EXPECT_EQ(serving_file(f), under_shim() ? lib : "") << f;
  }
}

TEST_F(SizedStruct, ConfigInitWritesTheCallersSizeOnly) {
  for (std::size_t size : {kFirstConfig, sizeof(tagmem_config), sizeof(tagmem_config) + 24}) {
    caller_buffer b(size, rng_);
    tagmem_config_init_sized(b.as<tagmem_config>(), size);
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(b.as<tagmem_config>()->struct_size, size);
    EXPECT_TRUE(b.zero_from(sizeof(std::size_t))) << size;
  }
  for (std::size_t size : {std::size_t{0}, kFirstConfig - 8, std::size_t{1} << 20}) {
    caller_buffer b(kRefusedBuffer, rng_);
    tagmem_config_init_sized(b.as<tagmem_config>(), size);
    EXPECT_TRUE(b.untouched()) << size;
  }
  tagmem_config macro = TAGMEM_CONFIG_INIT;
  EXPECT_EQ(macro.struct_size, sizeof(tagmem_config));
  tagmem_config c;
  std::memset(&c, 0xa5, sizeof c);
  tagmem_config_init(&c);
  EXPECT_EQ(c.struct_size, sizeof(tagmem_config));
  EXPECT_EQ(c.host_max_bytes, 0u);
}

TEST_F(SizedStruct, InitReadsTheCallersSizeOnly) {
  ASSERT_EQ(tagmem_free(p_, nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  // The first release's config: the random bytes after it would be a refused host_max_bytes.
  caller_buffer old(kFirstConfig, rng_);
  reinterpret_cast<unsigned char*>(old.data())[kFirstConfig + 7] |= 0x80;
  tagmem_config_init_sized(old.as<tagmem_config>(), kFirstConfig);
  old.as<tagmem_config>()->chunk_bytes = 4 << 20;
  ASSERT_EQ(tagmem_init(old.as<tagmem_config>()), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_malloc_tagged(&p_, size_, "sized", 0, nullptr), TAGMEM_SUCCESS);
  tagmem_tag_stats s;
  ASSERT_EQ(tagmem_tag_stats_get("sized", 0, &s), TAGMEM_SUCCESS);
  EXPECT_EQ(s.mapped_bytes, 4u << 20);  // the old struct's field was taken
  ASSERT_EQ(tagmem_free(p_, nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);

  // A newer caller's: zeros past this library's fields are fine, a set byte is refused.
  caller_buffer newer(sizeof(tagmem_config) + 16, rng_);
  tagmem_config_init_sized(newer.as<tagmem_config>(), sizeof(tagmem_config) + 16);
  ASSERT_EQ(tagmem_init(newer.as<tagmem_config>()), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  reinterpret_cast<unsigned char*>(newer.data())[sizeof(tagmem_config) + 3] = 1;
  EXPECT_EQ(tagmem_init(newer.as<tagmem_config>()), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("tagmem_config"), std::string::npos);

  // struct_size of no version: uninitialised, or zero.
  tagmem_config bad{};
  EXPECT_EQ(tagmem_init(&bad), TAGMEM_ERROR_INVALID_ARGUMENT);
  bad.struct_size = rng_() | (std::size_t{1} << 40);
  EXPECT_EQ(tagmem_init(&bad), TAGMEM_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_malloc_tagged(&p_, size_, "sized", 0, nullptr), TAGMEM_SUCCESS);
}

TEST_F(SizedStruct, TagStatsAtEverySize) {
  tagmem_tag_stats full;
  ASSERT_EQ(tagmem_tag_stats_get("sized", 0, &full), TAGMEM_SUCCESS);
  EXPECT_EQ(full.requested_bytes, size_);
  EXPECT_GE(full.peak_allocated_bytes, size_);
  // The first release's size, a size between versions, the release before parked_bytes, ours,
  // and a newer header's.
  for (std::size_t size :
       {kFirstTagStats, kFirstTagStats + 8, offsetof(tagmem_tag_stats, parked_bytes),
        sizeof(tagmem_tag_stats), sizeof(tagmem_tag_stats) + 40}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(tagmem_tag_stats_get_sized("sized", 0, b.as<tagmem_tag_stats>(), size),
              TAGMEM_SUCCESS);
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(std::memcmp(b.data(), &full, std::min(size, sizeof full)), 0) << size;
    EXPECT_TRUE(b.zero_from(sizeof full)) << size;
  }
  for (std::size_t size : {std::size_t{0}, std::size_t{8}, kFirstTagStats - 8, std::size_t{8192}}) {
    caller_buffer b(kRefusedBuffer, rng_);
    EXPECT_EQ(tagmem_tag_stats_get_sized("sized", 0, b.as<tagmem_tag_stats>(), size),
              TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(b.untouched()) << size;
  }
}

TEST_F(SizedStruct, DeviceStatsAtEverySize) {
  for (std::size_t size :
       {kFirstDeviceStats, sizeof(tagmem_device_stats), sizeof(tagmem_device_stats) + 16}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(tagmem_device_stats_get_sized(0, b.as<tagmem_device_stats>(), size), TAGMEM_SUCCESS);
    EXPECT_TRUE(b.guard_intact()) << size;
    const tagmem_device_stats* s = b.as<tagmem_device_stats>();
    EXPECT_GE(s->allocated_bytes, size_);
    EXPECT_EQ(s->tags, 1u);
    if (size >= sizeof(tagmem_device_stats)) {
      EXPECT_GT(s->host_budget_bytes, 0u);
    }
    EXPECT_TRUE(b.zero_from(sizeof(tagmem_device_stats))) << size;
  }
  for (std::size_t size : {std::size_t{0}, kFirstDeviceStats - 1, std::size_t{4097}}) {
    caller_buffer b(kRefusedBuffer, rng_);
    EXPECT_EQ(tagmem_device_stats_get_sized(0, b.as<tagmem_device_stats>(), size),
              TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(b.untouched()) << size;
  }
}

TEST_F(SizedStruct, HandoffStatsRefusedWhileHandoffIsOff) {
  caller_buffer b(sizeof(tagmem_handoff_stats), rng_);
  EXPECT_EQ(
      tagmem_handoff_stats_get_sized(0, b.as<tagmem_handoff_stats>(), sizeof(tagmem_handoff_stats)),
      TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("TAGMEM_HANDOFF"), std::string::npos) << last_error();
  EXPECT_TRUE(b.untouched());
}

TEST_F(PeerSizedStruct, HandoffStatsAtEverySize) {
  ASSERT_EQ(tagmem_handoff_expect(0, size_), TAGMEM_SUCCESS) << last_error();
  tagmem_handoff_stats full;
  std::memset(&full, 0xa5, sizeof full);
  ASSERT_EQ(tagmem_handoff_stats_get(0, &full), TAGMEM_SUCCESS) << last_error();
  EXPECT_EQ(full.listening, 1);  // the last field: written at today's size
  EXPECT_EQ(full.held_bytes, 0u);
  EXPECT_EQ(full.refused_peers, 0u);
  for (std::size_t size :
       {kFirstHandoffStats, sizeof(tagmem_handoff_stats), sizeof(tagmem_handoff_stats) + 40}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(tagmem_handoff_stats_get_sized(0, b.as<tagmem_handoff_stats>(), size), TAGMEM_SUCCESS)
        << size << ": " << last_error();
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(std::memcmp(b.data(), &full, std::min(size, sizeof full)), 0) << size;
    EXPECT_TRUE(b.zero_from(sizeof full)) << size;
  }
  for (std::size_t size : sizes_of_no_version(kFirstHandoffStats)) {
    caller_buffer b(kRefusedBuffer, rng_);
    EXPECT_EQ(tagmem_handoff_stats_get_sized(0, b.as<tagmem_handoff_stats>(), size),
              TAGMEM_ERROR_INVALID_ARGUMENT)
        << size;
    EXPECT_NE(last_error().find("tagmem_handoff_stats: size " + std::to_string(size)),
              std::string::npos)
        << last_error();
    EXPECT_TRUE(b.untouched()) << size;
  }
  EXPECT_EQ(tagmem_handoff_stats_get_sized(0, nullptr, sizeof full), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tagmem_handoff_cancel(0), TAGMEM_SUCCESS) << last_error();
}

TEST_F(PeerSizedStruct, IpcStatsAtEverySize) {
  tagmem_ipc_handle handle;
  ASSERT_EQ(tagmem_ipc_export(p_, size_, &handle), TAGMEM_SUCCESS) << last_error();
  tagmem_ipc_stats full;
  std::memset(&full, 0xa5, sizeof full);
  ASSERT_EQ(tagmem_ipc_stats_get(&full), TAGMEM_SUCCESS) << last_error();
  EXPECT_EQ(full.exports, 1u);
  EXPECT_EQ(full.importers, 0u);
  EXPECT_EQ(full.open_here, 0u);
  EXPECT_EQ(full.held_bytes, 0u);  // the last field
  for (std::size_t size : {kFirstIpcStats, offsetof(tagmem_ipc_stats, held_bytes),
                           sizeof(tagmem_ipc_stats), sizeof(tagmem_ipc_stats) + 24}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(tagmem_ipc_stats_get_sized(b.as<tagmem_ipc_stats>(), size), TAGMEM_SUCCESS)
        << size << ": " << last_error();
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(std::memcmp(b.data(), &full, std::min(size, sizeof full)), 0) << size;
    EXPECT_TRUE(b.zero_from(sizeof full)) << size;
  }
  for (std::size_t size : sizes_of_no_version(kFirstIpcStats)) {
    caller_buffer b(kRefusedBuffer, rng_);
    EXPECT_EQ(tagmem_ipc_stats_get_sized(b.as<tagmem_ipc_stats>(), size),
              TAGMEM_ERROR_INVALID_ARGUMENT)
        << size;
    EXPECT_NE(last_error().find("tagmem_ipc_stats: size " + std::to_string(size)),
              std::string::npos)
        << last_error();
    EXPECT_TRUE(b.untouched()) << size;
  }
  EXPECT_EQ(tagmem_ipc_stats_get_sized(nullptr, sizeof full), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tagmem_ipc_unexport(&handle), TAGMEM_SUCCESS) << last_error();
}

// tagmem_nccl.h's struct, in the shim only: looked up with dlsym, as its header says.
TEST_F(SizedStruct, NcclStatsAtEverySize) {
  using sized_fn = tagmem_status (*)(tagmem_nccl_stats*, size_t);
  using first_fn = tagmem_status (*)(tagmem_nccl_stats*);
  const auto get = reinterpret_cast<sized_fn>(dlsym(RTLD_DEFAULT, "tagmem_nccl_stats_get_sized"));
  const auto get_first = reinterpret_cast<first_fn>(dlsym(RTLD_DEFAULT, "tagmem_nccl_stats_get"));
  if (!under_shim()) {
    EXPECT_EQ(get, nullptr) << "libtagmem.so exports tagmem_nccl_stats_get_sized";
    EXPECT_EQ(get_first, nullptr) << "libtagmem.so exports tagmem_nccl_stats_get";
    GTEST_SKIP() << "tagmem_nccl_stats is the shim's: abi_sized_struct_preload_emu tests it";
  }
  ASSERT_NE(get, nullptr);
  ASSERT_NE(get_first, nullptr);
  tagmem_nccl_stats full;
  std::memset(&full, 0xa5, sizeof full);
  ASSERT_EQ(get(&full, sizeof full), TAGMEM_SUCCESS) << last_error();
  EXPECT_EQ(full.paused, 0);
  EXPECT_EQ(full.backup_store_used_bytes, 0u);  // the last field: written at today's size
  for (std::size_t size : {kFirstNcclStats, sizeof(tagmem_nccl_stats),
                           sizeof(tagmem_nccl_stats) + 8, sizeof(tagmem_nccl_stats) + 48}) {
    caller_buffer b(size, rng_);
    ASSERT_EQ(get(b.as<tagmem_nccl_stats>(), size), TAGMEM_SUCCESS) << size << ": " << last_error();
    EXPECT_TRUE(b.guard_intact()) << size;
    EXPECT_EQ(std::memcmp(b.data(), &full, std::min(size, sizeof full)), 0) << size;
    EXPECT_TRUE(b.zero_from(sizeof full)) << size;
  }
  for (std::size_t size : sizes_of_no_version(kFirstNcclStats)) {
    caller_buffer b(kRefusedBuffer, rng_);
    EXPECT_EQ(get(b.as<tagmem_nccl_stats>(), size), TAGMEM_ERROR_INVALID_ARGUMENT) << size;
    EXPECT_NE(last_error().find("tagmem_nccl_stats: size " + std::to_string(size)),
              std::string::npos)
        << last_error();
    EXPECT_TRUE(b.untouched()) << size;
  }
  EXPECT_EQ(get(nullptr, sizeof full), TAGMEM_ERROR_INVALID_ARGUMENT);
  // The exported function of the header where tagmem_nccl_stats_get was one: the first struct.
  caller_buffer old(kFirstNcclStats, rng_);
  ASSERT_EQ(get_first(old.as<tagmem_nccl_stats>()), TAGMEM_SUCCESS) << last_error();
  EXPECT_TRUE(old.guard_intact());
  EXPECT_EQ(std::memcmp(old.data(), &full, kFirstNcclStats), 0);
}

}  // namespace
