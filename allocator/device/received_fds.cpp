// received_fds.cpp — descriptors kept beside imported handles (Note [one hop] in the header).
#include "device/received_fds.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>

#include "driver/driver.hpp"

namespace tagmem::received_fds {
namespace {

struct book {
  std::mutex mutex;
  std::unordered_map<CUmemGenericAllocationHandle, int> fds;
};

book& the_book() {
  static book* b = new book();  // never destroyed: releases may run during exit
  return *b;
}

}  // namespace

bool keep(CUmemGenericAllocationHandle handle, int fd) noexcept {
  book& b = the_book();
  std::lock_guard lock(b.mutex);
  try {
    const auto [it, added] = b.fds.emplace(handle, fd);
    if (!added) {  // a handle released without forget: its old descriptor is stale
      ::close(it->second);
      it->second = fd;
    }
  } catch (...) {
    return false;
  }
  return true;
}

int shareable_fd(CUmemGenericAllocationHandle handle, CUresult* why) noexcept {
  int fd = -1;
  const CUresult r = driver::api().cuMemExportToShareableHandle(
      &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r == CUDA_SUCCESS) return fd;
  if (why) *why = r;
  book& b = the_book();
  std::lock_guard lock(b.mutex);
  const auto it = b.fds.find(handle);
  return it == b.fds.end() ? -1 : ::fcntl(it->second, F_DUPFD_CLOEXEC, 0);
}

void forget(CUmemGenericAllocationHandle handle) noexcept {
  book& b = the_book();
  int fd = -1;
  {
    std::lock_guard lock(b.mutex);
    const auto it = b.fds.find(handle);
    if (it == b.fds.end()) return;
    fd = it->second;
    b.fds.erase(it);
  }
  ::close(fd);
}

CUresult release_handle(CUmemGenericAllocationHandle handle) noexcept {
  const CUresult r = driver::api().cuMemRelease(handle);
  if (r == CUDA_SUCCESS) forget(handle);
  return r;
}

}  // namespace tagmem::received_fds
