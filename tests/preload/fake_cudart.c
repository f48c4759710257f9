/* fake_cudart.c — a stand-in for a dynamically linked CUDA runtime (what PyTorch uses), so the
 * shim's cudaMalloc/cudaFree interposers can be tested on the emulated driver: the real
 * libcudart needs a real driver. Its allocation calls go to the driver's cuMemAlloc/cuMemFree
 * (looked up with cuGetProcAddress; this library is not a recorded caller, so it gets the
 * driver's own functions) and are counted, so a test sees which calls reached it. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef int fake_error; /* same size and values as cudaError_t */
enum { kSuccess = 0, kInvalidValue = 1, kMemoryAllocation = 2, kInitializationError = 3 };

/* Set once (pthread_once) and counted atomically: threads of a test call these at once. */
static CUresult (*alloc_fn)(CUdeviceptr*, size_t);
static CUresult (*free_fn)(CUdeviceptr);
static uint64_t calls;
static pthread_once_t loaded = PTHREAD_ONCE_INIT;

static void load_once(void) {
  const char* path = getenv("TAGMEM_LIBCUDA");
  void* lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  CUresult (*gpa)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*) =
      (CUresult(*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*))dlsym(
          lib, "cuGetProcAddress_v2");
  if (!gpa) return;
  void* a = 0;
  void* f = 0;
  gpa("cuMemAlloc", &a, CUDA_VERSION, 0, 0);
  gpa("cuMemFree", &f, CUDA_VERSION, 0, 0);
  free_fn = (CUresult(*)(CUdeviceptr))f;
  alloc_fn = (CUresult(*)(CUdeviceptr*, size_t))a;
}

static int load(void) {
  pthread_once(&loaded, load_once);
  return alloc_fn && free_fn;
}

uint64_t tagmem_fake_cudart_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

fake_error cudaGetDevice(int* device) {
  *device = 0;
  return kSuccess;
}

/* A capture begun and nothing captured: what the shim's interposer passes on to. */
fake_error cudaStreamBeginCapture(void* stream, int mode) {
  (void)stream;
  (void)mode;
  return kSuccess;
}

fake_error cudaMalloc(void** ptr, size_t size) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  if (size == 0) { /* what the real runtime does */
    *ptr = 0;
    return kSuccess;
  }
  if (!load()) return kInitializationError;
  CUdeviceptr p = 0;
  if (alloc_fn(&p, size) != CUDA_SUCCESS) return kMemoryAllocation;
  *ptr = (void*)p;
  return kSuccess;
}

fake_error cudaMallocAsync(void** ptr, size_t size, void* stream) {
  (void)stream;
  return cudaMalloc(ptr, size);
}

fake_error cudaFree(void* ptr) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  if (!ptr) return kSuccess;
  if (!load()) return kInitializationError;
  return free_fn((CUdeviceptr)ptr) == CUDA_SUCCESS ? kSuccess : kInvalidValue;
}

fake_error cudaFreeAsync(void* ptr, void* stream) {
  (void)stream;
  return cudaFree(ptr);
}
