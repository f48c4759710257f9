// shared_buffer.cpp — the memfd that holds a replicated tag's one host copy (Note [shared host
// copy] in shared_buffer.hpp).
#include "replica/shared_buffer.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"

namespace tagmem {

namespace {
constexpr std::uint64_t kMagic = 0x7461676d656d5231ull;  // "tagmemR1"
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
}  // namespace

struct shared_buffer::header {
  std::uint64_t magic;
  std::uint64_t identity;
  std::uint64_t bytes;
  std::uint32_t shares;
  std::uint32_t reserved;
  std::int32_t pid[kMaxReplicas];
  std::uint32_t written[kMaxReplicas];  // read and written atomically: other processes set them
};

shared_buffer::header& shared_buffer::head() const noexcept {
  static_assert(sizeof(header) <= kHeaderBytes);
  return *reinterpret_cast<header*>(base_);
}

std::unique_ptr<shared_buffer> shared_buffer::create(device& dev, std::uint64_t identity,
                                                     std::size_t bytes, int shares) {
  TAGMEM_EXPECTS(shares >= 1 && shares <= kMaxReplicas, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "a replication group has 1.." + std::to_string(kMaxReplicas) + " replicas");
  const int fd = ::memfd_create("tagmem-replica", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  TAGMEM_EXPECTS(
      fd >= 0, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
      std::string("memfd_create for a replicated tag's host copy failed: ") + std::strerror(errno));
  std::unique_ptr<shared_buffer> b(new shared_buffer(dev, fd, bytes, shares));
  TAGMEM_EXPECTS(::ftruncate(fd, static_cast<off_t>(b->mapped_bytes())) == 0 &&
                     ::fcntl(fd, F_ADD_SEALS, kSeals) == 0,
                 TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "sizing the host copy of a replicated tag (" + std::to_string(bytes) +
                     " bytes) failed: " + std::strerror(errno));
  b->map_and_register();
  header& h = b->head();
  h.identity = identity;
  h.bytes = bytes;
  h.shares = static_cast<std::uint32_t>(shares);
  __atomic_store_n(&h.magic, kMagic, __ATOMIC_RELEASE);
  return b;
}

std::unique_ptr<shared_buffer> shared_buffer::adopt(device& dev, int fd, std::uint64_t identity,
                                                    std::size_t bytes, int shares,
                                                    const std::string& sender) {
  std::unique_ptr<shared_buffer> b(new shared_buffer(dev, fd, bytes, shares));
  const std::string bad = sender + " sent a host copy for a replicated tag that ";
  struct stat st {};
  TAGMEM_EXPECTS(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                     static_cast<std::size_t>(st.st_size) == b->mapped_bytes(),
                 TAGMEM_ERROR_PEER,
                 bad + "is not a file of " + std::to_string(b->mapped_bytes()) + " bytes");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  TAGMEM_EXPECTS(seals >= 0 && (seals & kSeals) == kSeals, TAGMEM_ERROR_PEER,
                 bad + "is not sealed against resizing");
  b->map_and_register();
  const header& h = b->head();
  TAGMEM_EXPECTS(__atomic_load_n(&h.magic, __ATOMIC_ACQUIRE) == kMagic && h.identity == identity &&
                     h.bytes == bytes && h.shares == static_cast<std::uint32_t>(shares),
                 TAGMEM_ERROR_PEER, bad + "holds another tag, group or size");
  return b;
}

void shared_buffer::map_and_register() {
  void* p = ::mmap(nullptr, mapped_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  TAGMEM_EXPECTS(
      p != MAP_FAILED, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
      "mapping the host copy of a replicated tag failed: " + std::string(std::strerror(errno)));
  base_ = static_cast<char*>(p);
  ::madvise(p, mapped_bytes(), MADV_HUGEPAGE);  // where shared memory may use huge pages
  context_guard guard(dev_.context());
  TAGMEM_CU(cuMemHostRegister, p, mapped_bytes(), 0u);
  registered_ = true;
}

shared_buffer::~shared_buffer() {
  if (registered_) {
    try {
      context_guard guard(dev_.context());
      driver::api().cuMemHostUnregister(base_);  // nothing to do if it fails: the unmap follows
    } catch (...) {  // no context to make current: the unmap still ends the registration's use
    }
  }
  if (base_) ::munmap(base_, mapped_bytes());
  if (fd_ >= 0) ::close(fd_);
}

bool shared_buffer::written(int share) const noexcept {
  return __atomic_load_n(&head().written[share], __ATOMIC_ACQUIRE) != 0;
}

void shared_buffer::mark_written(int share) noexcept {
  __atomic_store_n(&head().written[share], 1u, __ATOMIC_RELEASE);
}

pid_t shared_buffer::pid_of(int share) const noexcept { return head().pid[share]; }

void shared_buffer::set_pid(int share, pid_t pid) noexcept { head().pid[share] = pid; }

}  // namespace tagmem
