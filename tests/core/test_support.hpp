// test_support.hpp — what the core suites share: a fixture that gives each test a fresh
// tagmem, device copies through the driver table, random bytes, and the emulator's controls.
//
// The same binary runs against the emulated driver (TAGMEM_LIBCUDA names libtagmem_emu.so) and
// the real one; tests reach device memory only through driver copies so they run unchanged on
// both. Suites named Emulator* use what only the emulator offers (host-visible device memory,
// RSS, fault injection) and are excluded from the GPU run by name, never skipped silently.
#pragma once

#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "driver/driver.hpp"
#include "emu_controls.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::test {

// Fails the test with tagmem's message unless `s` is TAGMEM_SUCCESS.
#define TAGMEM_OK(expr)                                                                \
  do {                                                                                 \
    tagmem_status s_ = (expr);                                                         \
    ASSERT_EQ(s_, TAGMEM_SUCCESS) << #expr << ": " << tagmem_status_string(s_) << ": " \
                                  << tagmem_last_error();                              \
  } while (0)

// Expects a given failure status and a non-empty message.
#define TAGMEM_FAILS_WITH(expr, code)                                         \
  do {                                                                        \
    tagmem_status s_ = (expr);                                                \
    EXPECT_EQ(s_, code) << #expr << " returned " << tagmem_status_string(s_); \
    EXPECT_STRNE(tagmem_last_error(), "") << #expr;                           \
  } while (0)

bool using_emulator();
// Whether a suite of this name needs the emulator (Emulator*, and parameterized P/Emulator*).
bool emulator_suite(std::string_view suite);

// A generator seeded from the test's name and a per-run seed printed once (TAGMEM_TEST_SEED
// overrides it) so a failure can be replayed.
std::mt19937_64 rng_for_test();
std::vector<unsigned char> random_bytes(std::mt19937_64& rng, std::size_t n);

// Makes device 0's primary context current on the calling thread (for direct driver calls).
void use_primary_context();

// Synchronous copies through the driver, with device 0's primary context current.
void write_device(void* dst, const void* src, std::size_t n);
void read_device(void* dst, const void* src, std::size_t n);
std::vector<unsigned char> read_device(const void* src, std::size_t n);

// An allocation and the random bytes written to it.
struct filled {
  void* ptr;
  std::vector<unsigned char> bytes;
};
// `count` allocations of `size` bytes in `tag`, each filled with random bytes (stops at the first
// that fails, which fails the test).
std::vector<filled> fill(std::mt19937_64& rng, const char* tag, int count, std::size_t size);
// How many of `all` no longer hold their bytes.
std::size_t corrupted(const std::vector<filled>& all);
// Writes fresh random bytes to each of `all` (and keeps them for corrupted()).
void refill(std::mt19937_64& rng, std::vector<filled>& all);
// The state of `tag` on device 0 (fails the test if its statistics cannot be read).
tagmem_tag_state state_of(const char* tag);
// Frees each of `all` (a failure fails the test).
void free_all(const std::vector<filled>& all);
// Shuts tagmem down and initialises it again with the environment variable `name` set to `value`
// (restored afterwards).
void restart_with_env(const char* name, const char* value);

// The driver table tagmem loaded (valid once tagmem is initialised).
inline const driver::table& driver_api_for_tests() { return driver::api(); }

// Free device memory as the driver reports it.
std::size_t device_free_bytes(int device = 0);

// How far free device memory may move without tagmem doing anything: exact on the emulator; on
// a real GPU the driver's own small allocations (streams, events) move it by up to 2 MiB.
inline double free_memory_noise() { return using_emulator() ? 0.0 : double(2u << 20); }

// Resident set size of this process, in bytes.
std::size_t rss_bytes();

// The emulator's control API (tests of Emulator* suites only): tests/faults/emu_controls.hpp,
// found in the same library instance tagmem loads; every member is null on the real driver.
inline const reliability::emu_controls& emulator() { return reliability::emu(); }

// Sets an environment variable for the holder's lifetime, restoring what was there.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~scoped_env() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Gives each test a freshly initialised tagmem and shuts it down afterwards.
class tagmem_test : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
};

}  // namespace tagmem::test
