// device.cpp — per-device context, properties, copy streams and events (see device.hpp).
#include "device/device.hpp"

#include "device/release_clock.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"

namespace tagmem {

device::device(int ordinal, const config& cfg) : ordinal_(ordinal), kernel_use_(cfg.copy_kernel) {
  int count = 0;
  TAGMEM_CU(cuDeviceGetCount, &count);
  TAGMEM_EXPECTS(ordinal >= 0 && ordinal < count, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "device " + std::to_string(ordinal) + " does not exist (" + std::to_string(count) +
                     " devices)");
  TAGMEM_CU(cuDeviceGet, &dev_, ordinal);
  int vmm = 0;
  TAGMEM_CU(cuDeviceGetAttribute, &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            dev_);
  TAGMEM_EXPECTS(
      vmm, TAGMEM_ERROR_DRIVER,
      "device " + std::to_string(ordinal) + " does not support virtual memory management");
  TAGMEM_CU(cuDevicePrimaryCtxRetain, &context_, dev_);
  try {
    context_guard guard(context_);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = ordinal;
    TAGMEM_CU(cuDeviceGetUuid, &uuid_, dev_);
    // Exportable memory serves handoff and IPC (Note [ipc] in handoff/ipc_server.hpp).
    if (cfg.handoff || cfg.ipc) {
      int fds = 0;
      TAGMEM_CU(cuDeviceGetAttribute, &fds,
                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev_);
      exports_handles_ = fds != 0;
      if (exports_handles_) {
        prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      } else {
        if (logging(log_level::info)) {
          log_line("exportable-memory off device=" + std::to_string(ordinal) +
                   " reason=no-posix-fd-handles");
        }
      }
    }
    TAGMEM_CU(cuMemGetAllocationGranularity, &granularity_, &prop_,
              CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    TAGMEM_EXPECTS(cfg.chunk_bytes % granularity_ == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                   "chunk_bytes is not a multiple of the device's granularity " +
                       std::to_string(granularity_));
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::size_t free_bytes = 0;
    TAGMEM_CU(cuMemGetInfo, &free_bytes, &total_bytes_);
    for (int i = 0; i < cfg.copy_streams; ++i) {
      CUstream s = nullptr;
      TAGMEM_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
      d2h_.push_back(s);
      TAGMEM_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
      h2d_.push_back(s);
    }
    // Loaded now rather than at the first reload after a release: the load's cost stays out of
    // that reload, and the kernel's stream lives as long as the others.
    if (kernel_use_ != copy_kernel_use::off) kernel_.load(dev_, ordinal_);
  } catch (...) {
    kernel_.unload();
    for (CUstream s : d2h_) driver::api().cuStreamDestroy(s);
    for (CUstream s : h2d_) driver::api().cuStreamDestroy(s);
    driver::api().cuDevicePrimaryCtxRelease(dev_);
    throw;
  }
}

device::~device() {
  const auto& api = driver::api();
  CUcontext previous = nullptr;
  api.cuCtxGetCurrent(&previous);
  api.cuCtxSetCurrent(context_);
  recycler_.release_all(releases_);  // parked mappings are unmapped first
  releases_.drain();                 // while the context is still retained
  for (CUstream s : d2h_) api.cuStreamDestroy(s);
  for (CUstream s : h2d_) api.cuStreamDestroy(s);
  kernel_.unload();
  ways_.free_page();
  for (CUevent e : free_events_) api.cuEventDestroy(e);
  api.cuCtxSetCurrent(previous);
  api.cuDevicePrimaryCtxRelease(dev_);
}

// Waits for every copy stream even after one fails, and waits once more on a stream whose wait
// failed: callers unmap device memory or hand host extents back as soon as this returns or
// throws, so no copy they queued may still be running (a sticky context error fails the second
// wait at once; a transient failure does not leave the copies unattended).
CUresult device::wait_copy_streams() noexcept {
  CUresult first = CUDA_SUCCESS;
  auto wait = [&](CUstream s) {
    CUresult r = driver::api().cuStreamSynchronize(s);
    if (r != CUDA_SUCCESS) driver::api().cuStreamSynchronize(s);
    if (first == CUDA_SUCCESS) first = r;
  };
  for (const auto* list : {&d2h_, &h2d_}) {
    for (CUstream s : *list) wait(s);
  }
  if (CUstream s = kernel_.stream()) wait(s);
  return first;
}

bool device::copy_kernel_wanted() const noexcept {
  return kernel_use_ == copy_kernel_use::always ||
         (kernel_use_ == copy_kernel_use::after_release && release_clock::after_release());
}

void device::synchronize_copy_streams() {
  driver::check(wait_copy_streams(), "cuStreamSynchronize");
}

CUevent device::acquire_event() {
  {
    std::lock_guard lock(events_mutex_);
    if (!free_events_.empty()) {
      CUevent e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  CUevent e = nullptr;
  TAGMEM_CU(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  return e;
}

void device::release_event(CUevent e) noexcept {
  std::lock_guard lock(events_mutex_);
  try {
    free_events_.push_back(e);
  } catch (...) {
    driver::api().cuEventDestroy(e);
  }
}

// Records an event on `producer` and hands it to `use`; the event goes back to the pool after.
template <class Use>
void device::with_recorded(CUstream producer, Use use) {
  CUevent e = acquire_event();
  try {
    TAGMEM_CU(cuEventRecord, e, producer);
    use(e);
  } catch (...) {
    release_event(e);
    throw;
  }
  release_event(e);  // a recorded event may be re-recorded once the wait is enqueued
}

void device::order_after(CUstream waiter, CUstream producer) {
  if (waiter == producer) return;
  with_recorded(producer, [&](CUevent e) { TAGMEM_CU(cuStreamWaitEvent, waiter, e, 0); });
}

void device::wait_on_host(CUstream producer) {
  with_recorded(producer, [](CUevent e) { TAGMEM_CU(cuEventSynchronize, e); });
}

void device::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  context_guard guard(context_);
  TAGMEM_CU(cuMemGetInfo, free_bytes, total_bytes);
}

}  // namespace tagmem
