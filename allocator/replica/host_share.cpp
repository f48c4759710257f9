// host_share.cpp — Note [two ways to share host memory] in host_share.hpp.
#include "replica/host_share.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "base/byte_math.hpp"
#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "host/host_budget.hpp"
#include "host/host_pinning.hpp"
#include "observe/log.hpp"

namespace tagmem {

namespace {
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// Note [shared copy fault-in]: the pages of a new memfd are allocated (and zeroed) by the kernel
// at first touch, which the driver's registration would do one page at a time on one thread;
// touching them first from several threads (TAGMEM_HOST_PIN_THREADS, as the host store pins) leaves
// the registration only the page walk. Touching more than the machine or the memory cgroup has
// left would have the kernel kill the process, so make() first checks the memory against the
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

// The host-located allocation closest to `dev`: its host NUMA node where the driver names one,
// else node 0 (a machine without NUMA has only that one).
CUmemAllocationProp host_prop(device& dev) {
  int numa = -1;
  if (driver::api().cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
                                         dev.access_desc().location.id) != CUDA_SUCCESS) {
    numa = -1;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = std::max(numa, 0);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

std::size_t host_granularity(const CUmemAllocationProp& prop) {
  std::size_t gran = 0;
  TAGMEM_CU(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  return std::max<std::size_t>(gran, 1);
}

}  // namespace

const char* host_share_way_name(host_share_way w) noexcept {
  return w == host_share_way::cumem ? "host cuMem" : "memfd";
}

std::unique_ptr<host_share> host_share::make(device& dev, std::size_t bytes,
                                             host_share_way prefer) {
  const std::size_t headroom = host_headroom(read_host_memory());
  TAGMEM_EXPECTS(bytes <= headroom, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "shared host memory of " + std::to_string(bytes) +
                     " bytes does not fit in the host memory left (" + std::to_string(headroom) +
                     " bytes after the margin)");
  if (prefer == host_share_way::cumem) {
    try {
      context_guard guard(dev.context());
      const CUmemAllocationProp prop = host_prop(dev);
      std::unique_ptr<host_share> s(new host_share(dev, host_share_way::cumem, -1, bytes));
      s->span_ = round_up_checked(bytes, host_granularity(prop), TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                                  "shared host memory");
      TAGMEM_CU(cuMemCreate, &s->handle_, s->span_, &prop, 0);
      TAGMEM_CU(cuMemExportToShareableHandle, &s->fd_, s->handle_,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      s->map_cumem(prop, "");
      return s;
    } catch (const error& e) {  // this driver does not offer it: the memfd way
      if (logging(log_level::info)) {
        log_line(std::string("shared host memory: host cuMem refused, using a memfd: ") + e.what());
      }
    }
  }
  const int fd = ::memfd_create("tagmem-shared-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  TAGMEM_EXPECTS(
      fd >= 0, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
      std::string("memfd_create for shared host memory failed: ") + std::strerror(errno));
  std::unique_ptr<host_share> s(new host_share(dev, host_share_way::memfd, fd, bytes));
  TAGMEM_EXPECTS(
      ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 && ::fcntl(fd, F_ADD_SEALS, kSeals) == 0,
      TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
      "sizing shared host memory of " + std::to_string(bytes) +
          " bytes failed: " + std::strerror(errno));
  s->map_memfd(true);
  return s;
}

std::unique_ptr<host_share> host_share::open(device& dev, int fd, host_share_way way,
                                             std::size_t bytes, const std::string& bad) {
  std::unique_ptr<host_share> s(new host_share(dev, way, fd, bytes));
  if (way == host_share_way::memfd) {
    struct stat st {};
    TAGMEM_EXPECTS(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                       static_cast<std::size_t>(st.st_size) == bytes,
                   TAGMEM_ERROR_PEER, bad + "is not a file of " + std::to_string(bytes) + " bytes");
    const int seals = ::fcntl(fd, F_GET_SEALS);
    TAGMEM_EXPECTS(seals >= 0 && (seals & kSeals) == kSeals, TAGMEM_ERROR_PEER,
                   bad + "is not sealed against resizing");
    s->map_memfd(false);
    return s;
  }
  TAGMEM_EXPECTS(way == host_share_way::cumem, TAGMEM_ERROR_PEER,
                 bad + "is shared in no way this library knows");
  const driver::table& api = driver::api();
  context_guard guard(dev.context());
  const CUresult r = api.cuMemImportFromShareableHandle(
      &s->handle_, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  TAGMEM_EXPECTS(r == CUDA_SUCCESS, TAGMEM_ERROR_PEER,
                 bad + "is no memory the driver can import (" + driver::describe(r) + ")");
  CUmemAllocationProp prop{};
  TAGMEM_CU(cuMemGetAllocationPropertiesFromHandle, &prop, s->handle_);
  TAGMEM_EXPECTS(prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                     prop.location.type == CU_MEM_LOCATION_TYPE_HOST,
                 TAGMEM_ERROR_PEER, bad + "is not host memory");
  s->span_ = round_up_checked(bytes, host_granularity(prop), TAGMEM_ERROR_PEER, bad.c_str());
  s->map_cumem(prop, bad);
  return s;
}

void host_share::map_cumem(const CUmemAllocationProp& prop, const std::string& bad) {
  const driver::table& api = driver::api();
  CUdeviceptr va = 0;
  TAGMEM_CU(cuMemAddressReserve, &va, span_, host_granularity(prop), 0, 0);
  base_ = reinterpret_cast<char*>(va);
  const CUresult r = api.cuMemMap(va, span_, 0, handle_, 0);
  if (r != CUDA_SUCCESS && !bad.empty()) {  // an import smaller than it should be, most likely
    fail(TAGMEM_ERROR_PEER, bad + "cannot be mapped as " + std::to_string(span_) + " bytes (" +
                                driver::describe(r) + ")");
  }
  driver::check(r, "cuMemMap");
  mapped_ = true;
  CUmemAccessDesc access[2] = {dev_.access_desc(), {}};
  access[1].location = prop.location;
  access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  TAGMEM_CU(cuMemSetAccess, va, span_, access, 2);
}

void host_share::map_memfd(bool fault_in) {
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  TAGMEM_EXPECTS(p != MAP_FAILED, TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
                 "mapping shared host memory failed: " + std::string(std::strerror(errno)));
  base_ = static_cast<char*>(p);
  ::madvise(p, bytes_, MADV_HUGEPAGE);             // where shared memory may use huge pages
  if (fault_in) fault_in_parallel(base_, bytes_);  // Note [shared copy fault-in]
  context_guard guard(dev_.context());
  TAGMEM_CU(cuMemHostRegister, p, bytes_, 0u);
  registered_ = true;
}

host_share::~host_share() {
  const driver::table& api = driver::api();
  try {
    context_guard guard(dev_.context());
    if (registered_) api.cuMemHostUnregister(base_);  // nothing to do if it fails: unmap follows
    if (mapped_) api.cuMemUnmap(reinterpret_cast<CUdeviceptr>(base_), span_);
    if (way_ == host_share_way::cumem && base_) {
      api.cuMemAddressFree(reinterpret_cast<CUdeviceptr>(base_), span_);
    }
    if (handle_) api.cuMemRelease(handle_);
  } catch (...) {  // no context to make current: what the driver holds goes with the process
  }
  if (way_ == host_share_way::memfd && base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace tagmem
