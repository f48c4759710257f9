// support.hpp — shared pieces of the emulator's tests: a fixture that owns a primary context
// and checks that every test leaves nothing behind, random data, and process probes (RSS, the
// emulator's memfds) that show memory really goes back to the OS.
#pragma once

#include <cuda.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "emu_control.h"

#define CU_ASSERT(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define CU_EXPECT(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr

namespace tagmem::emu::test {

inline constexpr size_t mib = size_t{1} << 20;
inline constexpr size_t granule = 2 * mib;

// Bytes drawn from a generator seeded with `seed`: reproducible, different per test.
std::vector<unsigned char> random_bytes(size_t n, uint64_t seed);
// A seed from the running test's name.
uint64_t test_seed();

size_t rss_bytes();
// Open file descriptors of this process that are emulator memfds.
int emulator_memfds();
// Mappings of this process backed by emulator memfds.
int emulator_memfd_mappings();

CUmemAllocationProp device_prop(int device, bool shareable = false);
CUmemAccessDesc access(int device, CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

// Live emulator objects; equal before and after every test (the fixture checks).
struct live_counts {
  uint64_t allocations, mappings, reservations, device_allocations, streams, events,
      host_allocations, host_registrations, pinned_bytes;
  bool operator==(const live_counts&) const = default;
};
live_counts live_now();
void PrintTo(const live_counts& c, std::ostream* os);

// cuInit, device 0's primary context retained and current; afterwards: faults cleared, copies
// unthrottled, the context released (which clears sticky errors), no object leaked and no
// device byte still counted.
class emu_test : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  CUcontext ctx_ = nullptr;

 private:
  live_counts before_{};
};

// A reservation with one allocation mapped at its start and read-write for `device`; torn down
// in reverse by the destructor (or earlier by reset()).
class mapped_range {
 public:
  explicit mapped_range(size_t size, int device = 0, bool shareable = false);
  ~mapped_range() { reset(); }
  mapped_range(const mapped_range&) = delete;
  mapped_range& operator=(const mapped_range&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  unsigned char* host() const { return reinterpret_cast<unsigned char*>(ptr_); }
  size_t size() const { return size_; }
  CUmemGenericAllocationHandle handle() const { return handle_; }
  void reset();
  // Forgets the range without touching the driver (a test tore it down by hand).
  void disown() { ptr_ = 0; }

 private:
  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
};

}  // namespace tagmem::emu::test
