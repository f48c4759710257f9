// dl_route.cpp — where the dlsym/dlvsym trampolines go (Note [dlsym tail jump] in dl_hooks.S).
//
// The routers run on every dlsym in the process, so they decide without locking or allocating:
// anything but a driver symbol the shim may wrap (proc_address.hpp), anything asked from inside
// the shim, and every RTLD_NEXT lookup go to the real function with the caller's own return
// address. A driver symbol asked by handle or RTLD_DEFAULT goes to the shim's lookup, which
// resolves it for real and lets proc_address decide, from the caller remembered here, whether to
// hand out a wrapper.
//
// Note [RTLD_NEXT is the linker's]: "next" means after the object that called dlsym, and only
// glibc can search from there: the shim's lookup calls dlsym itself, so an RTLD_NEXT search from
// it starts after the shim. A library that defines a driver function and forwards to the next
// definition (a tracer wrapping cuGetProcAddress_v2, loaded after the shim) would get its own
// function back and recurse forever. So RTLD_NEXT lookups are never wrapped: glibc answers them
// and returns straight to their caller. That loses nothing the shim needs: NCCL's CUDA runtime
// finds the driver through a handle of libcuda (wrapped as before), and a library that asks
// RTLD_NEXT for a driver function is an interposer in front of the driver, not a caller whose
// allocations the shim records.
#include <dlfcn.h>

#include "proc_address.hpp"
#include "real_symbols.hpp"
#include "reentry_guard.hpp"

namespace tagmem::preload {
namespace {

__thread const void* t_caller __attribute__((tls_model("initial-exec"))) = nullptr;

void* lookup_dlsym(void* handle, const char* name) {
  const void* caller = t_caller;
  reentry_guard guard;
  return wrap_dlsym_result(name, real_dlsym()(handle, name), caller);
}

void* lookup_dlvsym(void* handle, const char* name, const char* version) {
  const void* caller = t_caller;
  reentry_guard guard;
  return wrap_dlsym_result(name, real_dlvsym()(handle, name, version), caller);
}

}  // namespace
}  // namespace tagmem::preload

using namespace tagmem::preload;

extern "C" __attribute__((visibility("hidden"))) TAGMEM_PRELOAD_EARLY void*
tagmem_preload_dlsym_route(void* handle, const char* name, const void* caller) {
  if (handle == RTLD_NEXT || reentry_guard::inside() || !driver_symbol_of_interest(name))
    return reinterpret_cast<void*>(real_dlsym());
  t_caller = caller;
  return reinterpret_cast<void*>(&lookup_dlsym);
}

extern "C" __attribute__((visibility("hidden"))) TAGMEM_PRELOAD_EARLY void*
tagmem_preload_dlvsym_route(void* handle, const char* name, const char*, const void* caller) {
  if (handle == RTLD_NEXT || reentry_guard::inside() || !driver_symbol_of_interest(name))
    return reinterpret_cast<void*>(real_dlvsym());
  t_caller = caller;
  return reinterpret_cast<void*>(&lookup_dlvsym);
}

#if !defined(__x86_64__)
// Without the trampolines, RTLD_NEXT lookups through the shim search after the shim rather than
// after their caller (see Note [dlsym tail jump]).
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  using fn = void* (*)(void*, const char*);
  auto target =
      reinterpret_cast<fn>(tagmem_preload_dlsym_route(handle, name, __builtin_return_address(0)));
  return target(handle, name);
}

extern "C" __attribute__((visibility("default"))) void* dlvsym(void* handle, const char* name,
                                                               const char* version) {
  using fn = void* (*)(void*, const char*, const char*);
  auto target = reinterpret_cast<fn>(
      tagmem_preload_dlvsym_route(handle, name, version, __builtin_return_address(0)));
  return target(handle, name, version);
}
#endif
