// shared_copy_test.cpp — the shared host copy of a replicated tag (Note [shared host copy] in
// allocator/replica/shared_buffer.hpp): what its maker writes the adopting process sees, shares
// are written per generation, and a descriptor that is not such a copy for this tag is refused
// (PEER) without a descriptor or mapping left behind. The replicas themselves are tested with
// several processes in tests/handoff/replica_test.cpp.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>

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
  if (seal) EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

class SharedCopy : public tagmem_test {
 protected:
  void expect_refused(device& dev, int fd, std::uint64_t identity, std::size_t bytes,
                      const char* why) {
    try {
      shared_buffer::adopt(dev, fd, identity, bytes, 2, "rank 0 (pid 1)");
      ADD_FAILURE() << "adopted: " << why;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), TAGMEM_ERROR_PEER) << e.what();
      EXPECT_NE(std::strstr(e.what(), why), nullptr) << e.what();
    }
  }
};

TEST_F(SharedCopy, TheAdopterSeesWhatTheMakerWroteShareByGeneration) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const int before = open_fds();
  {
    auto made = shared_buffer::create(dev, kIdentity, kBytes, 2);
    auto adopted =
        shared_buffer::adopt(dev, ::dup(made->fd()), kIdentity, kBytes, 2, "rank 0 (pid 1)");
    std::mt19937_64 rng(std::random_device{}());
    for (std::size_t i = 0; i + 8 <= kBytes; i += 8) {
      const std::uint64_t x = rng();
      std::memcpy(made->data() + i, &x, 8);
    }
    EXPECT_EQ(std::memcmp(made->data(), adopted->data(), kBytes), 0);
    EXPECT_EQ(adopted->token(), made->token());
    made->mark_written(1, 3);
    EXPECT_TRUE(adopted->written(1, 3));
    EXPECT_FALSE(adopted->written(1, 2)) << "an earlier generation's share passes for this one";
    EXPECT_FALSE(adopted->written(0, 3));
  }
  EXPECT_EQ(open_fds(), before);
}

TEST_F(SharedCopy, WhatIsNotACopyOfThisTagIsRefused) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  const int before = open_fds();
  expect_refused(dev, memfd_of(kBytes, false), kIdentity, kBytes, "not sealed");
  expect_refused(dev, memfd_of(kBytes, true), kIdentity, kBytes, "another tag");  // no header
  expect_refused(dev, memfd_of(kBytes, true), kIdentity, 2 * kBytes, "is not a file of");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  expect_refused(dev, pipe_fds[0], kIdentity, kBytes, "is not a file of");
  {
    auto made = shared_buffer::create(dev, kIdentity, kBytes, 2);
    expect_refused(dev, ::dup(made->fd()), kIdentity + 1, kBytes, "another tag");
  }
  EXPECT_EQ(open_fds(), before) << "a refused descriptor was left open";
}

}  // namespace
}  // namespace tagmem::test
