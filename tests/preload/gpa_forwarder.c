/* gpa_forwarder.c — a library in front of the driver, as a tracer or profiler would be: it
 * defines cuGetProcAddress_v2 and forwards every call to the next definition, found with
 * dlsym(RTLD_NEXT). The test dlopens it RTLD_GLOBAL after the shim, with the emulated driver as
 * its dependency (so the driver comes after it in every search order). Under a shim that
 * resolved RTLD_NEXT relative to itself the "next" definition would be this library's own; a
 * depth counter turns the resulting endless recursion into an error the test can see. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>

typedef CUresult (*gpa_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

static gpa_fn next_gpa;
static __thread int depth;
static uint64_t forwarded, recursions;

void* tagmem_forwarder_next(void) {
  if (!next_gpa) {
    /* Not a tail call: dlsym must see this library as its caller. */
    void* volatile f = dlsym(RTLD_NEXT, "cuGetProcAddress_v2");
    next_gpa = (gpa_fn)f;
  }
  return (void*)next_gpa;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  gpa_fn next = (gpa_fn)tagmem_forwarder_next();
  if (!next) return CUDA_ERROR_NOT_FOUND;
  if (depth > 0) { /* called again from inside our own forwarding: the next one is us */
    ++recursions;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  ++depth;
  CUresult r = next(symbol, pfn, version, flags, status);
  --depth;
  ++forwarded;
  return r;
}

/* What the driver answers for `name` through this library's cuGetProcAddress_v2. */
void* tagmem_forwarder_lookup(const char* name) {
  void* fn = 0;
  if (cuGetProcAddress_v2(name, &fn, CUDA_VERSION, 0, 0) != CUDA_SUCCESS) return 0;
  return fn;
}

uint64_t tagmem_forwarder_forwarded(void) { return forwarded; }
uint64_t tagmem_forwarder_recursions(void) { return recursions; }
