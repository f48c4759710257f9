// gpu_launch.c — runs a GPU test (label gpu) in its place, or reports it skipped when this machine
// has no CUDA device, so that `ctest` on a machine without a GPU shows those tests as skipped
// rather than failed.
//
// Usage: tagmem_gpu_launch PROGRAM [ARGS...]. It exits with TAGMEM_GPU_SKIP (the tests'
// SKIP_RETURN_CODE) only when the driver tagmem would load (TAGMEM_LIBCUDA, else libcuda.so.1)
// cannot be loaded, is the toolkit's link stub, or reports no device. Any other outcome, a driver
// that loads but fails in another way included, runs the test, whose failure then shows. The
// driver is probed in a child process, so the test starts in a process that never touched it.
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { TAGMEM_GPU_SKIP = 77 };

typedef CUresult (*cu_init_fn)(unsigned int);
typedef CUresult (*cu_device_get_count_fn)(int*);

// Runs in the child: TAGMEM_GPU_SKIP with the reason on stderr when there is no device, else 0.
static int probe(void) {
  const char* env = getenv("TAGMEM_LIBCUDA");
  const char* path = env && *env ? env : "libcuda.so.1";
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    fprintf(stderr, "tagmem_gpu_launch: SKIP: cannot load the CUDA driver (%s)\n", dlerror());
    return TAGMEM_GPU_SKIP;
  }
  cu_init_fn init = (cu_init_fn)dlsym(handle, "cuInit");
  cu_device_get_count_fn count = (cu_device_get_count_fn)dlsym(handle, "cuDeviceGetCount");
  if (!init || !count) return 0;  // not a driver we recognise: let the test say what is wrong
  CUresult status = init(0);
  if (status == CUDA_ERROR_NO_DEVICE || status == CUDA_ERROR_STUB_LIBRARY) {
    fprintf(stderr, "tagmem_gpu_launch: SKIP: '%s': cuInit returned %d (%s)\n", path, (int)status,
            status == CUDA_ERROR_NO_DEVICE ? "no CUDA device" : "the toolkit's link stub");
    return TAGMEM_GPU_SKIP;
  }
  int devices = -1;
  if (status == CUDA_SUCCESS && count(&devices) == CUDA_SUCCESS && devices == 0) {
    fprintf(stderr, "tagmem_gpu_launch: SKIP: '%s' reports no CUDA device\n", path);
    return TAGMEM_GPU_SKIP;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: tagmem_gpu_launch PROGRAM [ARGS...]\n");
    return 2;
  }
  fflush(NULL);
  pid_t child = fork();
  if (child < 0) {
    perror("tagmem_gpu_launch: fork");
    return 2;
  }
  if (child == 0) _exit(probe());
  int wstatus = 0;
  while (waitpid(child, &wstatus, 0) < 0) {
    if (errno == EINTR) continue;
    perror("tagmem_gpu_launch: waitpid");
    return 2;
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == TAGMEM_GPU_SKIP) return TAGMEM_GPU_SKIP;
  execvp(argv[1], argv + 1);
  perror("tagmem_gpu_launch: exec");
  return 2;
}
