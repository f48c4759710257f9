// modules.cpp — cuModuleLoadData, cuModuleGetFunction and cuModuleUnload.
//
// Note [emu kernels]: the emulator runs no device code. A module loads from any non-null image
// and offers one function, "tagmem_h2d_copy", the copy kernel tagmem launches for host-to-device
// copies (allocator/device/kernel_copy.cu); any other name is CUDA_ERROR_NOT_FOUND. cuLaunchKernel
// of it (copies.cpp) runs on its stream as a host-to-device copy, with the kernel's own rules: the
// source must be pinned host memory (a kernel cannot read pageable memory), which is checked
// when the copy executes, as a kernel faults then, not at launch.
#include "modules.hpp"

#include <cstring>
#include <memory>
#include <set>

#include "api.hpp"

namespace tagmem::emu {
namespace {

struct module_record {
  int copy_kernel = 0;  // its address is the module's one CUfunction
};

std::set<module_record*>& modules(lock&) {
  static auto* loaded = new std::set<module_record*>;  // leaked: see Note [emu locking]
  return *loaded;
}

}  // namespace

bool is_copy_kernel(lock& held, CUfunction f) {
  for (module_record* m : modules(held)) {
    if (reinterpret_cast<CUfunction>(&m->copy_kernel) == f) return true;
  }
  return false;
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  TAGMEM_EMU_ENTRY(cuModuleLoadData);
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto record = std::make_unique<module_record>();
  lock held = take_lock();
  modules(held).insert(record.get());
  *module = reinterpret_cast<CUmodule>(record.release());
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuModuleGetFunction(CUfunction* function, CUmodule module,
                                               const char* name) {
  TAGMEM_EMU_ENTRY(cuModuleGetFunction);
  if (function == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  auto* m = reinterpret_cast<module_record*>(module);
  if (modules(held).count(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (std::strcmp(name, "tagmem_h2d_copy") != 0) return CUDA_ERROR_NOT_FOUND;
  *function = reinterpret_cast<CUfunction>(&m->copy_kernel);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuModuleUnload(CUmodule module) {
  TAGMEM_EMU_ENTRY(cuModuleUnload);
  lock held = take_lock();
  auto* m = reinterpret_cast<module_record*>(module);
  if (modules(held).erase(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  delete m;
  return CUDA_SUCCESS;
}
