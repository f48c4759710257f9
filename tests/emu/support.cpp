// support.cpp — see support.hpp.
#include "support.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>

namespace tagmem::emu::test {

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<unsigned char> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t word = engine();
    std::memcpy(out.data() + i, &word, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<unsigned char>(engine());
  return out;
}

uint64_t test_seed() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::hash<std::string>{}(std::string(info->test_suite_name()) + "." + info->name());
}

size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

int emulator_memfds() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  while (dirent* entry = ::readdir(dir)) {
    char target[256] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    if (::readlink(path.c_str(), target, sizeof target - 1) > 0 &&
        std::strncmp(target, "/memfd:tagmem_emu:", 18) == 0)
      ++count;
  }
  ::closedir(dir);
  return count;
}

int emulator_memfd_mappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/memfd:tagmem_emu:") != std::string::npos) ++count;
  return count;
}

CUmemAllocationProp device_prop(int device, bool shareable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc access(int device, CUmemAccess_flags flags) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = flags;
  return desc;
}

live_counts live_now() {
  return {tagmem_emu_live_allocations(),      tagmem_emu_live_mappings(),
          tagmem_emu_live_reservations(),     tagmem_emu_live_device_allocations(),
          tagmem_emu_live_streams(),          tagmem_emu_live_events(),
          tagmem_emu_live_host_allocations(), tagmem_emu_live_host_registrations(),
          tagmem_emu_pinned_host_bytes()};
}

void PrintTo(const live_counts& c, std::ostream* os) {
  *os << "{allocations " << c.allocations << ", mappings " << c.mappings << ", reservations "
      << c.reservations << ", device allocations " << c.device_allocations << ", streams "
      << c.streams << ", events " << c.events << ", host allocations " << c.host_allocations
      << ", host registrations " << c.host_registrations << ", pinned bytes " << c.pinned_bytes
      << "}";
}

void emu_test::SetUp() {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the emulator runs threads
  before_ = live_now();
  CU_ASSERT(cuInit(0));
  CU_ASSERT(cuDevicePrimaryCtxRetain(&ctx_, 0));
  CU_ASSERT(cuCtxSetCurrent(ctx_));
}

void emu_test::TearDown() {
  tagmem_emu_clear_faults();
  tagmem_emu_set_copy_bytes_per_second(0);
  CU_EXPECT(cuCtxSetCurrent(nullptr));
  CU_EXPECT(cuDevicePrimaryCtxRelease(0));
  EXPECT_EQ(live_now(), before_) << "the test leaked emulator objects";
  for (int d = 0; d < tagmem_emu_device_count(); ++d) {
    EXPECT_EQ(tagmem_emu_device_used_bytes(d), 0u) << "device " << d;
    EXPECT_EQ(tagmem_emu_sticky_error(d), CUDA_SUCCESS) << "device " << d;
  }
}

mapped_range::mapped_range(size_t size, int device, bool shareable) : size_(size) {
  const CUmemAllocationProp prop = device_prop(device, shareable);
  const CUmemAccessDesc rw = access(device);
  EXPECT_EQ(cuMemAddressReserve(&ptr_, size, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemCreate(&handle_, size, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(ptr_, size, 0, handle_, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemSetAccess(ptr_, size, &rw, 1), CUDA_SUCCESS);
}

void mapped_range::reset() {
  if (ptr_ == 0) return;
  EXPECT_EQ(cuMemUnmap(ptr_, size_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(handle_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(ptr_, size_), CUDA_SUCCESS);
  ptr_ = 0;
}

}  // namespace tagmem::emu::test
