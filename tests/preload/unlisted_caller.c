/* unlisted_caller.c — a library not named in TAGMEM_PRELOAD_DRIVER_CALLERS that gets driver
 * entry points the NCCL way. The shim must hand it the driver's own functions. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>

typedef CUresult (*gpa_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

void* tagmem_unlisted_get_proc_address(void) {
  const char* path = getenv("TAGMEM_LIBCUDA");
  void* lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  /* Not a tail call: dlsym must see this library as its caller. */
  void* volatile gpa = lib ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
  return gpa;
}

void* tagmem_unlisted_lookup(const char* name) {
  gpa_fn gpa = (gpa_fn)tagmem_unlisted_get_proc_address();
  void* fn = NULL;
  if (!gpa || gpa(name, &fn, CUDA_VERSION, 0, NULL) != CUDA_SUCCESS) return NULL;
  return fn;
}
