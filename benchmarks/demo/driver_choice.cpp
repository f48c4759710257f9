// driver_choice.cpp — probe for a GPU, else fall back to the emulated driver (see header).
#include "driver_choice.hpp"

#include <cuda.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace tagmem::demo {
namespace {

// Whether libcuda.so.1 loads, initialises and reports a device. The handle stays open: tagmem
// opens the same library again and shares the driver's state.
bool real_gpu_present(std::string* detail) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    *detail = "libcuda.so.1 not found";
    return false;
  }
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<CUresult (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != CUDA_SUCCESS || count(&n) != CUDA_SUCCESS || n == 0) {
    *detail = "libcuda.so.1 loads but reports no usable device";
    return false;
  }
  return true;
}

std::string emulator_path(const char* argv0) {
  // Beside the demo's build tree location first, then the path CMake recorded at build time.
  char self[PATH_MAX] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string(argv0);
  dir = dir.substr(0, dir.find_last_of('/') + 1);
  for (std::string candidate :
       {dir + "libtagmem_emu.so", dir + "../../allocator/driver/emu/libtagmem_emu.so",
        dir + "../lib/libtagmem_emu.so", std::string(TAGMEM_EMU_BUILD_PATH)}) {
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return TAGMEM_EMU_BUILD_PATH;
}

}  // namespace

driver_choice choose_driver(const char* argv0) {
  driver_choice c;
  if (const char* env = std::getenv("TAGMEM_LIBCUDA"); env && *env) {
    c.library = env;
    c.emulated = std::strstr(env, "tagmem_emu") != nullptr;
    c.why = "TAGMEM_LIBCUDA is set";
    return c;
  }
  std::string detail;
  if (real_gpu_present(&detail)) {
    c.library = "libcuda.so.1";
    c.why = "a GPU is present";
    return c;
  }
  c.emulated = true;
  c.library = emulator_path(argv0);
  c.why = detail;
  setenv("TAGMEM_LIBCUDA", c.library.c_str(), 1);
  return c;
}

}  // namespace tagmem::demo
