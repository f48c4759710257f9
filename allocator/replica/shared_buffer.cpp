// shared_buffer.cpp — the memfd that holds a replicated tag's one host copy (Note [shared host
// copy] in shared_buffer.hpp).
#include "replica/shared_buffer.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "host/host_budget.hpp"
#include "host/host_pinning.hpp"

namespace tagmem {

namespace {
constexpr std::uint64_t kMagic = 0x7461676d656d5231ull;  // "tagmemR1"
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
// Note [shared copy fault-in]: the pages of a new memfd are allocated (and zeroed) by the kernel
// at first touch, which the driver's registration would do one page at a time on one thread;
// touching them first from several threads (TAGMEM_HOST_PIN_THREADS, as the host store pins) leaves
// the registration only the page walk. Touching more than the machine or the memory cgroup has
// left would have the kernel kill the process, so create() first checks the copy against the
// host budget's headroom (Note [host budget]) and refuses with HOST_OUT_OF_MEMORY.
void fault_in_parallel(char* base, std::size_t bytes) {
  const unsigned threads = std::max(1u, pin_threads_from_env());
  const std::size_t page = 4096, per = (bytes / page + threads - 1) / threads * page;
  std::vector<std::thread> pool;
  auto touch = [=](std::size_t lo) noexcept {
    const std::size_t hi = std::min(bytes, lo + per);
    for (std::size_t at = lo; at < hi; at += page) {
      *static_cast<volatile char*>(base + at) = 0;
    }
  };
  for (unsigned t = 1; t < threads && t * per < bytes; ++t) {
    try {
      pool.emplace_back(touch, t * per);
    } catch (...) {  // fewer threads: this one touches what they would have
      for (std::size_t lo = t * per; lo < bytes; lo += per) touch(lo);
      break;
    }
  }
  touch(0);
  for (std::thread& th : pool) th.join();
}

}  // namespace

struct shared_buffer::header {
  std::uint64_t magic;
  std::uint64_t identity;
  std::uint64_t token;
  std::uint64_t bytes;
  std::uint32_t shares;
  std::uint32_t reserved;
  std::int32_t pid[kMaxReplicas];
  std::uint32_t written[kMaxReplicas];  // generations, read and written atomically: other
                                        // processes set them
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
  const std::size_t headroom = host_headroom(read_host_memory());
  TAGMEM_EXPECTS(b->mapped_bytes() <= headroom, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "the host copy of a replicated tag (" + std::to_string(bytes) +
                     " bytes) does not fit in the host memory left (" + std::to_string(headroom) +
                     " bytes after the margin)");
  TAGMEM_EXPECTS(::ftruncate(fd, static_cast<off_t>(b->mapped_bytes())) == 0 &&
                     ::fcntl(fd, F_ADD_SEALS, kSeals) == 0,
                 TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "sizing the host copy of a replicated tag (" + std::to_string(bytes) +
                     " bytes) failed: " + std::strerror(errno));
  b->map_and_register(true);
  header& h = b->head();
  h.identity = identity;
  h.token = (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
            reinterpret_cast<std::uintptr_t>(b->base_);
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
  b->map_and_register(false);
  const header& h = b->head();
  TAGMEM_EXPECTS(__atomic_load_n(&h.magic, __ATOMIC_ACQUIRE) == kMagic && h.identity == identity &&
                     h.bytes == bytes && h.shares == static_cast<std::uint32_t>(shares),
                 TAGMEM_ERROR_PEER, bad + "holds another tag, group or size");
  return b;
}

void shared_buffer::map_and_register(bool fault_in) {
  void* p = ::mmap(nullptr, mapped_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  TAGMEM_EXPECTS(
      p != MAP_FAILED, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
      "mapping the host copy of a replicated tag failed: " + std::string(std::strerror(errno)));
  base_ = static_cast<char*>(p);
  ::madvise(p, mapped_bytes(), MADV_HUGEPAGE);             // where shared memory may use huge pages
  if (fault_in) fault_in_parallel(base_, mapped_bytes());  // Note [shared copy fault-in]
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

std::uint64_t shared_buffer::token() const noexcept { return head().token; }

bool shared_buffer::written(int share, std::uint32_t generation) const noexcept {
  return __atomic_load_n(&head().written[share], __ATOMIC_ACQUIRE) == generation;
}

void shared_buffer::mark_written(int share, std::uint32_t generation) noexcept {
  __atomic_store_n(&head().written[share], generation, __ATOMIC_RELEASE);
}

pid_t shared_buffer::pid_of(int share) const noexcept { return head().pid[share]; }

void shared_buffer::set_pid(int share, pid_t pid) noexcept { head().pid[share] = pid; }

}  // namespace tagmem
