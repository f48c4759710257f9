// kernel_copy.cpp — loading and launching the copy kernel (Note [copy kernel] in kernel_copy.hpp).
#include "device/kernel_copy.hpp"

#include <cstddef>
#include <string>

#include "base/error.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"

namespace tagmem {

extern const unsigned char kernel_copy_image[];  // kernel_copy.cu, embedded by the build
extern const std::size_t kernel_copy_image_size;

namespace {

// One block of this many threads per SM: as fast as larger grids on an H200, and it leaves room
// on each SM for the application's kernels (docs/performance.md, "After a release").
constexpr unsigned threads_per_block = 256;

}  // namespace

bool kernel_copy::load(CUdevice dev, int ordinal) noexcept {
  try {
    load_or_throw(dev, ordinal);
  } catch (const std::exception& e) {
    unload();
    if (logging(log_level::info)) {
      log_line("copy kernel unavailable on device " + std::to_string(ordinal) +
               ", copy engines only: " + e.what());
    }
  }
  return stream_ != nullptr;
}

void kernel_copy::load_or_throw(CUdevice dev, int ordinal) {
  TAGMEM_EXPECTS(kernel_copy_image_size != 0, TAGMEM_ERROR_DRIVER,
                 "libtagmem was built without nvcc");
  int unified = 0, host_pointer = 0, sms = 0;
  TAGMEM_CU(cuDeviceGetAttribute, &unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev);
  TAGMEM_CU(cuDeviceGetAttribute, &host_pointer,
            CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev);
  TAGMEM_CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  TAGMEM_EXPECTS(unified && host_pointer && sms > 0, TAGMEM_ERROR_DRIVER,
                 "device " + std::to_string(ordinal) +
                     " cannot read registered host memory at its host address");
  TAGMEM_CU(cuModuleLoadData, &module_, kernel_copy_image);
  TAGMEM_CU(cuModuleGetFunction, &function_, module_, "tagmem_h2d_copy");
  CUstream s = nullptr;
  TAGMEM_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
  grid_ = static_cast<unsigned>(sms);
  stream_ = s;  // last: a non-null stream means loaded
}

void kernel_copy::launch(CUdeviceptr dst, const void* src, std::size_t size) {
  unsigned long long bytes = size;
  void* params[] = {&src, &dst, &bytes};
  TAGMEM_CU(cuLaunchKernel, function_, grid_, 1, 1, threads_per_block, 1, 1, 0, stream(), params,
            nullptr);
}

void kernel_copy::unload() noexcept {
  const auto& api = driver::api();
  if (stream_ != nullptr) api.cuStreamDestroy(stream_);
  stream_ = nullptr;
  if (module_ != nullptr) api.cuModuleUnload(module_);
  module_ = nullptr;
  function_ = nullptr;
}

}  // namespace tagmem
