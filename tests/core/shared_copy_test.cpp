// shared_copy_test.cpp — the shared host copy of a replicated tag (Note [shared host copy] in
// allocator/replica/shared_buffer.hpp) over either way of sharing host memory (Note [two ways to
// share host memory] in allocator/replica/host_share.hpp): what its maker writes the adopting
// process sees, on the host and through the device, shares are written per generation, a
// descriptor that is not such a copy for this tag is refused (PEER) without a descriptor or
// mapping left behind, and a driver that refuses host cuMem gets the memfd. The replicas
// themselves are tested with several processes in tests/handoff/replica_test.cpp.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/error.hpp"
#include "device/device.hpp"
#include "options/config.hpp"
#include "replica/shared_buffer.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t kBytes = std::size_t{1} << 20;
constexpr std::uint64_t kIdentity = 0x1234;

int open_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// A memfd of `bytes` with the header page, sealed as a copy is when `seal`.
int memfd_of(std::size_t bytes, bool seal) {
  const int fd = ::memfd_create("not-a-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(shared_buffer::kHeaderBytes + bytes)), 0);
  if (seal) {
    EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  }
  return fd;
}

void fill_random(char* p, std::size_t n) {
  std::mt19937_64 rng = rng_for_test();
  const std::vector<unsigned char> bytes = random_bytes(rng, n);
  std::memcpy(p, bytes.data(), n);
}

// The bytes at host address `p` as the device reads them (a copy through device memory).
std::vector<unsigned char> through_device(const char* p, std::size_t n) {
  use_primary_context();
  const driver::table& cu = driver_api_for_tests();
  CUdeviceptr d = 0;
  EXPECT_EQ(cu.cuMemAlloc(&d, n), CUDA_SUCCESS);
  std::vector<unsigned char> out(n);
  EXPECT_EQ(cu.cuMemcpyHtoD(d, p, n), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuMemcpyDtoH(out.data(), d, n), CUDA_SUCCESS);
  cu.cuMemFree(d);
  return out;
}

class SharedCopy : public tagmem_test, public ::testing::WithParamInterface<host_share_way> {
 protected:
  void expect_refused(device& dev, int fd, host_share_way way, std::uint64_t identity,
                      std::size_t bytes, const char* why) {
    try {
      shared_buffer::adopt(dev, fd, way, identity, bytes, 2, "rank 0 (pid 1)");
      ADD_FAILURE() << "adopted: " << why;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), TAGMEM_ERROR_PEER) << e.what();
      EXPECT_NE(std::strstr(e.what(), why), nullptr) << e.what();
    }
  }
};

TEST_P(SharedCopy, TheAdopterSeesWhatTheMakerWroteShareByGeneration) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const int before = open_fds();
  {
    auto made = shared_buffer::create(dev, kIdentity, kBytes, 2, GetParam());
    ASSERT_EQ(made->way(), GetParam()) << "this driver refused host cuMem";
    auto adopted = shared_buffer::adopt(dev, ::dup(made->fd()), made->way(), kIdentity, kBytes, 2,
                                        "rank 0 (pid 1)");
    fill_random(made->data(), kBytes);
    EXPECT_EQ(std::memcmp(made->data(), adopted->data(), kBytes), 0);
    const std::vector<unsigned char> seen = through_device(adopted->data(), kBytes);
    EXPECT_EQ(std::memcmp(made->data(), seen.data(), kBytes), 0)
        << "the device reads other bytes than the maker wrote";
    EXPECT_EQ(adopted->token(), made->token());
    for (int share = 0; share < 2; ++share) EXPECT_FALSE(adopted->written(share, 1));
    made->mark_written(1, 3);
    EXPECT_TRUE(adopted->written(1, 3));
    EXPECT_FALSE(adopted->written(1, 2)) << "an earlier generation's share passes for this one";
    EXPECT_FALSE(adopted->written(0, 3));
  }
  EXPECT_EQ(open_fds(), before);
}

TEST_P(SharedCopy, AnotherTagsCopyIsRefused) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const int before = open_fds();
  {
    auto made = shared_buffer::create(dev, kIdentity, kBytes, 2, GetParam());
    expect_refused(dev, ::dup(made->fd()), made->way(), kIdentity + 1, kBytes, "another tag");
  }
  EXPECT_EQ(open_fds(), before) << "a refused descriptor was left open";
}

INSTANTIATE_TEST_SUITE_P(Ways, SharedCopy,
                         ::testing::Values(host_share_way::cumem, host_share_way::memfd),
                         [](const auto& info) {
                           return host_share_way_name(info.param)[0] == 'm' ? std::string("memfd")
                                                                            : std::string("cumem");
                         });

class SharedCopyRefusal : public SharedCopy {};

TEST_F(SharedCopyRefusal, WhatIsNotAMemfdCopyOfThisTagIsRefused) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const int before = open_fds();
  const host_share_way memfd = host_share_way::memfd;
  expect_refused(dev, memfd_of(kBytes, false), memfd, kIdentity, kBytes, "not sealed");
  expect_refused(dev, memfd_of(kBytes, true), memfd, kIdentity, kBytes, "another tag");
  expect_refused(dev, memfd_of(kBytes, true), memfd, kIdentity, 2 * kBytes, "is not a file of");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  expect_refused(dev, pipe_fds[0], memfd, kIdentity, kBytes, "is not a file of");
  EXPECT_EQ(open_fds(), before) << "a refused descriptor was left open";
}

TEST_F(SharedCopyRefusal, WhatIsNotAHostCuMemCopyOfThisTagIsRefused) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const int before = open_fds();
  const host_share_way cumem = host_share_way::cumem;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  expect_refused(dev, pipe_fds[0], cumem, kIdentity, kBytes, "no memory the driver can import");
  {  // a memfd copy passed off as host cuMem
    auto memfd_copy = shared_buffer::create(dev, kIdentity, kBytes, 2, host_share_way::memfd);
    expect_refused(dev, ::dup(memfd_copy->fd()), cumem, kIdentity, kBytes,
                   "no memory the driver can import");
  }
  {  // a smaller copy than the tag needs
    auto small = shared_buffer::create(dev, kIdentity, kBytes, 2, cumem);
    ASSERT_EQ(small->way(), cumem) << "this driver refused host cuMem";
    expect_refused(dev, ::dup(small->fd()), cumem, kIdentity, 64 * kBytes, "cannot be mapped");
  }
  {  // device memory, exported the same way
    use_primary_context();
    const driver::table& cu = driver_api_for_tests();
    CUmemAllocationProp prop = dev.allocation_prop();
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0;
    ASSERT_EQ(cu.cuMemCreate(&h, dev.granularity(), &prop, 0), CUDA_SUCCESS);
    int fd = -1;
    ASSERT_EQ(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    expect_refused(dev, fd, cumem, kIdentity, kBytes, "is not host memory");
    cu.cuMemRelease(h);
  }
  EXPECT_EQ(open_fds(), before) << "a refused descriptor was left open";
}

class EmulatorSharedCopy : public SharedCopy {};

TEST_F(EmulatorSharedCopy, ADriverWithoutHostCuMemGetsTheMemfd) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const reliability::emu_census before = reliability::take_census();
  const int fds_before = open_fds();
  {
    ASSERT_EQ(emulator().fail_call("cuMemCreate", 1, CUDA_ERROR_NOT_SUPPORTED), 0);
    auto made = shared_buffer::create(dev, kIdentity, kBytes, 2);
    emulator().clear_faults();
    EXPECT_EQ(made->way(), host_share_way::memfd);
    auto adopted = shared_buffer::adopt(dev, ::dup(made->fd()), made->way(), kIdentity, kBytes, 2,
                                        "rank 0 (pid 1)");
    fill_random(made->data(), kBytes);
    const std::vector<unsigned char> seen = through_device(adopted->data(), kBytes);
    EXPECT_EQ(std::memcmp(made->data(), seen.data(), kBytes), 0);
  }
  EXPECT_EQ(open_fds(), fds_before);
  const reliability::emu_census after = reliability::take_census();
  EXPECT_EQ(before, after) << reliability::describe_difference(before, after);
}

}  // namespace
}  // namespace tagmem::test
