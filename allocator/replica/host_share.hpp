// host_share.hpp — host memory that the processes of a node map together and the GPU copies to
// and from at the link's rate: the memory under a replicated tag's shared copy.
//
// Note [two ways to share host memory]: host-located cuMem (cuMemCreate at the device's host NUMA
// node, exported as a POSIX file descriptor, mapped for the device and the host in each process)
// is the first choice; a sealed memfd, mapped MAP_SHARED and registered with cuMemHostRegister in
// each process, is the fallback where the driver offers no host-located allocations (drivers
// before CUDA 12.2, or a refusal). docs/replicated.md measures the two side by side
// (tagmem_bench_shared_host): cuMem opens several times faster in the other processes and copies
// host to device faster, while every reload of a replicated tag copies host to device. Neither can
// be resized by a process holding it (a cuMem allocation has a fixed size; the memfd is sealed),
// so no peer can truncate the memory under another's mapping.
//
// The maker picks the way and sends it with the descriptor; the other processes open that way and
// check what they were given (a host-located allocation at least as large; a sealed file of the
// exact size) before touching a byte. The destructor undoes what was done; the memory goes once
// the last process holding it lets go, or dies.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>

#include "device/device.hpp"

namespace tagmem {

enum class host_share_way : int { cumem = 1, memfd = 2 };

const char* host_share_way_name(host_share_way w) noexcept;

class host_share {
 public:
  // `bytes` of zeroed shared host memory, made the first way the driver allows (`prefer` cumem) or
  // the memfd way (`prefer` memfd). Throws HOST_OUT_OF_MEMORY or DRIVER when neither way can.
  static std::unique_ptr<host_share> make(device& dev, std::size_t bytes, host_share_way prefer);
  // Takes ownership of `fd` whatever happens. Throws PEER, prefixed with `bad`, when the
  // descriptor is not `bytes` of shared host memory made the way `way`.
  static std::unique_ptr<host_share> open(device& dev, int fd, host_share_way way,
                                          std::size_t bytes, const std::string& bad);
  ~host_share();
  host_share(const host_share&) = delete;
  host_share& operator=(const host_share&) = delete;

  char* base() const noexcept { return base_; }
  std::size_t bytes() const noexcept { return bytes_; }
  int fd() const noexcept { return fd_; }
  host_share_way way() const noexcept { return way_; }

 private:
  host_share(device& dev, host_share_way way, int fd, std::size_t bytes)
      : dev_(dev), way_(way), fd_(fd), bytes_(bytes) {}
  // Each throws; the destructor undoes what was done. map_cumem maps handle_ for the device and
  // the host (`bad` non-empty: a map that fails is the sender's fault, PEER); map_memfd maps fd_
  // and registers it, touching every page first when `fault_in`.
  void map_cumem(const CUmemAllocationProp& prop, const std::string& bad);
  void map_memfd(bool fault_in);

  device& dev_;
  host_share_way way_;
  int fd_ = -1;
  std::size_t bytes_ = 0;
  char* base_ = nullptr;
  // the cuMem way
  CUmemGenericAllocationHandle handle_ = 0;
  std::size_t span_ = 0;  // the reservation, a multiple of the host allocation granularity
  bool mapped_ = false;
  // the memfd way
  bool registered_ = false;
};

}  // namespace tagmem
