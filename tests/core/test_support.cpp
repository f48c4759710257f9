// test_support.cpp — fixture, device copies, randomness and emulator controls (see header).
#include "test_support.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "driver/driver.hpp"

namespace tagmem::test {
namespace {

CUcontext primary_context() {
  static CUcontext ctx = [] {
    CUdevice dev = 0;
    CUcontext c = nullptr;
    driver::check(driver::api().cuDeviceGet(&dev, 0), "cuDeviceGet");
    driver::check(driver::api().cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
    return c;
  }();
  driver::check(driver::api().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

std::uint64_t run_seed() {
  static std::uint64_t seed = [] {
    const char* env = std::getenv("TAGMEM_TEST_SEED");
    std::uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::fprintf(stderr, "[tagmem tests] TAGMEM_TEST_SEED=%llu\n",
                 static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

}  // namespace

bool emulator_suite(std::string_view suite) {
  // A parameterized suite is named prefix/Suite; the prefixes used here start with Emulator too.
  return suite.starts_with("Emulator") || suite.find("/Emulator") != std::string_view::npos;
}

bool using_emulator() {
  const char* lib = std::getenv("TAGMEM_LIBCUDA");
  return lib && std::strstr(lib, "tagmem_emu") != nullptr;
}

std::mt19937_64 rng_for_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  return std::mt19937_64(run_seed() ^ std::hash<std::string>()(name));
}

namespace {
void fill_random(std::mt19937_64& rng, unsigned char* v, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>(rng());
}
}  // namespace

std::vector<unsigned char> random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<unsigned char> v(n);
  fill_random(rng, v.data(), n);
  return v;
}

void use_primary_context() { primary_context(); }

void write_device(void* dst, const void* src, std::size_t n) {
  primary_context();
  driver::check(driver::api().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, n),
                "cuMemcpyHtoD");
}

void read_device(void* dst, const void* src, std::size_t n) {
  primary_context();
  driver::check(driver::api().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), n),
                "cuMemcpyDtoH");
}

std::vector<unsigned char> read_device(const void* src, std::size_t n) {
  std::vector<unsigned char> v(n);
  read_device(v.data(), src, n);
  return v;
}

std::vector<filled> fill(std::mt19937_64& rng, const char* tag, int count, std::size_t size) {
  std::vector<filled> out;
  for (int i = 0; i < count; ++i) {
    void* p = nullptr;
    EXPECT_EQ(tagmem_malloc_tagged(&p, size, tag, 0, nullptr), TAGMEM_SUCCESS)
        << tag << ": " << tagmem_last_error();
    if (!p) break;
    out.push_back({p, random_bytes(rng, size)});
    write_device(p, out.back().bytes.data(), size);
  }
  return out;
}

void refill(std::mt19937_64& rng, std::vector<filled>& all) {
  for (filled& a : all) {
    fill_random(rng, a.bytes.data(), a.bytes.size());  // in place: the same bytes, no new pages
    write_device(a.ptr, a.bytes.data(), a.bytes.size());
  }
}

tagmem_tag_state state_of(const char* tag) {
  tagmem_tag_stats s{};
  EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.state;
}

void free_all(const std::vector<filled>& all) {
  for (const filled& a : all) EXPECT_EQ(tagmem_free(a.ptr, nullptr), TAGMEM_SUCCESS);
}

void restart_with_env(const char* name, const char* value) {
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  scoped_env env(name, value);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
}

std::size_t corrupted(const std::vector<filled>& all) {
  // Compared a window at a time through one reused buffer: a fresh vector per allocation costs
  // more in page faults and zeroing than the copy and the comparison themselves.
  constexpr std::size_t window = std::size_t{8} << 20;
  static thread_local std::vector<unsigned char> buffer(window);
  std::size_t bad = 0;
  for (const auto& a : all) {
    for (std::size_t at = 0; at < a.bytes.size(); at += window) {
      const std::size_t n = std::min(window, a.bytes.size() - at);
      read_device(buffer.data(), static_cast<const unsigned char*>(a.ptr) + at, n);
      if (std::memcmp(buffer.data(), a.bytes.data() + at, n) != 0) {
        ++bad;
        break;
      }
    }
  }
  return bad;
}

std::size_t device_free_bytes(int device) {
  tagmem_device_stats s{};
  if (tagmem_device_stats_get(device, &s) != TAGMEM_SUCCESS) return 0;
  return s.device_free_bytes;
}

std::size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

void tagmem_test::SetUp() {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  primary_context();
  // An Emulator* test run on the real driver would call the emulator's controls, null there, and
  // crash the binary; failing here skips its body and reports the test as failed instead.
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  ASSERT_FALSE(info && emulator_suite(info->test_suite_name()) && !emulator().available)
      << info->test_suite_name() << " needs the emulated driver: TAGMEM_LIBCUDA naming "
      << "libtagmem_emu.so (on a GPU, run the suites with --gtest_filter=-Emulator*)";
}

void tagmem_test::TearDown() {
  if (using_emulator() && emulator().clear_faults) emulator().clear_faults();
  EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
}

}  // namespace tagmem::test
