// cuda_calls.cpp — loading the demo's own driver calls (see cuda_calls.hpp).
#include "cuda_calls.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>

namespace tagmem::demo {
namespace {

using get_proc_fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult*);

template <class F>
void resolve(get_proc_fn get_proc, const char* name, F* out) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (get_proc(name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
      !fn) {
    throw std::runtime_error(std::string("the CUDA driver has no ") + name);
  }
  *out = reinterpret_cast<F>(fn);
}

cuda_calls load() {
  const char* env = std::getenv("TAGMEM_LIBCUDA");
  const std::string path = env && *env ? env : "libcuda.so.1";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw std::runtime_error("cannot load the CUDA driver " + path);
  auto get_proc = reinterpret_cast<get_proc_fn>(dlsym(h, "cuGetProcAddress_v2"));
  if (!get_proc) throw std::runtime_error(path + " has no cuGetProcAddress_v2");
  cuda_calls c;
  resolve(get_proc, "cuInit", &c.init);
  resolve(get_proc, "cuDeviceGet", &c.device_get);
  resolve(get_proc, "cuDevicePrimaryCtxRetain", &c.primary_ctx_retain);
  resolve(get_proc, "cuCtxSetCurrent", &c.ctx_set_current);
  resolve(get_proc, "cuMemHostAlloc", &c.host_alloc);
  resolve(get_proc, "cuMemFreeHost", &c.free_host);
  resolve(get_proc, "cuMemcpyHtoD", &c.copy_to_device);
  resolve(get_proc, "cuMemcpyDtoH", &c.copy_to_host);
  resolve(get_proc, "cuGetErrorString", &c.error_string);
  check_cuda(c.init(0), "cuInit");
  return c;
}

}  // namespace

const cuda_calls& cuda() {
  static const cuda_calls calls = load();
  return calls;
}

void check_cuda(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (cuda().error_string) cuda().error_string(r, &text);
  throw std::runtime_error(std::string(what) + " failed: " +
                           (text ? text : "CUDA error " + std::to_string(static_cast<int>(r))));
}

}  // namespace tagmem::demo
