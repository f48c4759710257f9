// device_access.cpp — primary contexts, copy streams and the backup store (see header).
#include "device_access.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "driver/driver.hpp"

namespace tagmem::nccl {
namespace {

constexpr std::size_t kPieceBytes = 64ull << 20;  // one copy; several stay in flight

struct per_device {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
};

std::mutex g_mutex;
std::map<int, per_device>& devices() {
  static auto* m = new std::map<int, per_device>;  // leaked with the contexts it retains
  return *m;
}
host_store* g_store = nullptr;  // leaked: pinned pages are kept for the process's life

}  // namespace

void ensure_driver() { driver::load(); }

CUcontext primary_context(int ordinal) {
  ensure_driver();
  std::lock_guard lock(g_mutex);
  per_device& d = devices()[ordinal];
  if (!d.context) {
    CUdevice dev = 0;
    TAGMEM_CU(cuDeviceGet, &dev, ordinal);
    TAGMEM_CU(cuDevicePrimaryCtxRetain, &d.context, dev);
  }
  return d.context;
}

device_scope::device_scope(int ordinal) {
  CUcontext ctx = primary_context(ordinal);
  TAGMEM_CU(cuCtxGetCurrent, &previous_);
  TAGMEM_CU(cuCtxSetCurrent, ctx);
}

device_scope::~device_scope() { driver::api().cuCtxSetCurrent(previous_); }

CUstream copy_stream(int ordinal) {
  CUcontext ctx = primary_context(ordinal);
  std::lock_guard lock(g_mutex);
  per_device& d = devices()[ordinal];
  if (!d.stream) {
    CUcontext previous = nullptr;
    TAGMEM_CU(cuCtxGetCurrent, &previous);
    TAGMEM_CU(cuCtxSetCurrent, ctx);
    CUresult r = driver::api().cuStreamCreate(&d.stream, CU_STREAM_NON_BLOCKING);
    driver::api().cuCtxSetCurrent(previous);
    driver::check(r, "cuStreamCreate");
  }
  return d.stream;
}

host_store* existing_backup_store() noexcept {
  std::lock_guard lock(g_mutex);
  return g_store;
}

host_store& backup_store(int ordinal) {
  CUcontext ctx = primary_context(ordinal);
  std::lock_guard lock(g_mutex);
  if (!g_store) g_store = new host_store(256ull << 20, ctx);
  return *g_store;
}

void queue_to_host(const meta_vector<host_extent>& extents, CUdeviceptr va, CUstream stream) {
  for (const host_extent& e : extents) {
    for (std::size_t done = 0; done < e.size;) {
      std::size_t n = std::min(kPieceBytes, e.size - done);
      TAGMEM_CU(cuMemcpyDtoHAsync, e.ptr + done, va + done, n, stream);
      done += n;
    }
    va += e.size;
  }
}

void queue_to_device(const meta_vector<host_extent>& extents, CUdeviceptr va, CUstream stream) {
  for (const host_extent& e : extents) {
    for (std::size_t done = 0; done < e.size;) {
      std::size_t n = std::min(kPieceBytes, e.size - done);
      TAGMEM_CU(cuMemcpyHtoDAsync, va + done, e.ptr + done, n, stream);
      done += n;
    }
    va += e.size;
  }
}

}  // namespace tagmem::nccl
