/* shim_ipc.c — the shim's cudaIpcGetMemHandle / cudaIpcOpenMemHandle / cudaIpcCloseMemHandle for
 * tagmem memory (integrations/preload/ipc_hooks.cpp), between two processes that run under
 * libtagmem_preload.so on the emulated driver.
 *
 * The exporter allocates in a tag, fills the allocation with seeded random bytes and asks for the
 * handle of an address inside it, as PyTorch does for a tensor inside a segment; the importer
 * (this program again) opens it, gets the start of the allocation, checks every byte, writes its
 * own, and closes it. The exporter sees those bytes, cannot offload the tag while the importer
 * maps it (PEER), and can once it has closed. A handle that is not tagmem's goes to the CUDA
 * runtime, and so does closing an address the shim did not open (no runtime here: both fail).
 * Exit status 0 when every check passed; a failed check prints its line. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tagmem/tagmem.h"

typedef struct {
  char reserved[64];
} ipc_handle; /* cudaIpcMemHandle_t */

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

static int remove_entry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  (void)st;
  (void)type;
  (void)ftw;
  return remove(path);
}

static void* sym(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (!p) {
    fprintf(stderr, "no symbol %s (run under libtagmem_preload.so)\n", name);
    exit(2);
  }
  return p;
}

/* The emulated driver's copies, from the library the shim loaded (dlopen returns that one). */
static CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t);
static CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t);

static void driver(void) {
  void* lib = dlopen(getenv("TAGMEM_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
  if (!lib) exit(2);
  CUresult (*gpa)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*) =
      (CUresult(*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*))dlsym(
          lib, "cuGetProcAddress_v2");
  void *init = 0, *h2d = 0, *d2h = 0, *get = 0, *retain = 0, *set = 0;
  gpa("cuInit", &init, CUDA_VERSION, 0, 0);
  gpa("cuMemcpyHtoD", &h2d, CUDA_VERSION, 0, 0);
  gpa("cuMemcpyDtoH", &d2h, CUDA_VERSION, 0, 0);
  gpa("cuDeviceGet", &get, CUDA_VERSION, 0, 0);
  gpa("cuDevicePrimaryCtxRetain", &retain, CUDA_VERSION, 0, 0);
  gpa("cuCtxSetCurrent", &set, CUDA_VERSION, 0, 0);
  memcpy_htod = (CUresult(*)(CUdeviceptr, const void*, size_t))h2d;
  memcpy_dtoh = (CUresult(*)(void*, CUdeviceptr, size_t))d2h;
  CUdevice dev = 0;
  CUcontext ctx = 0;
  ((CUresult(*)(unsigned))init)(0);
  ((CUresult(*)(CUdevice*, int))get)(&dev, 0);
  ((CUresult(*)(CUcontext*, CUdevice))retain)(&ctx, dev);
  ((CUresult(*)(CUcontext))set)(ctx);
}

static void seeded(uint64_t seed, unsigned char* out, size_t n) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    out[i] = (unsigned char)x;
  }
}

enum { kBytes = 3 << 20, kInside = 8192 };

static int importer(int in, int out) {
  driver();
  int (*open_handle)(void**, ipc_handle, unsigned) = sym("cudaIpcOpenMemHandle");
  int (*close_handle)(void*) = sym("cudaIpcCloseMemHandle");
  ipc_handle h;
  uint64_t seeds[2];
  if (read(in, &h, sizeof h) != sizeof h || read(in, seeds, sizeof seeds) != sizeof seeds) return 3;
  void* p = NULL;
  CHECK(open_handle(&p, h, 1) == 0);
  unsigned char* want = malloc(kBytes);
  unsigned char* got = malloc(kBytes);
  seeded(seeds[0], want, kBytes);
  CHECK(p && memcpy_dtoh(got, (CUdeviceptr)p, kBytes) == CUDA_SUCCESS);
  CHECK(memcmp(got, want, kBytes) == 0); /* the whole allocation, from its start */
  seeded(seeds[1], want, kBytes);
  CHECK(memcpy_htod((CUdeviceptr)p, want, kBytes) == CUDA_SUCCESS);
  char c = 'w';
  CHECK(write(out, &c, 1) == 1);
  CHECK(read(in, &c, 1) == 1 && c == 'c');
  CHECK(close_handle(p) == 0);
  CHECK(close_handle(p) != 0); /* not open any more: the runtime's (none here) */
  ipc_handle other;
  memset(&other, 0x11, sizeof other);
  void* q = NULL;
  CHECK(open_handle(&q, other, 1) != 0); /* not tagmem's: the runtime's (none here) */
  h.reserved[40] ^= 0x5a;                /* a forged secret */
  CHECK(open_handle(&q, h, 1) != 0);
  c = 'd';
  CHECK(write(out, &c, 1) == 1);
  free(want);
  free(got);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "importer") == 0) {
    return importer(atoi(argv[2]), atoi(argv[3]));
  }
  char dir[] = "/tmp/tagmem-shim-ipc-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  char job[64];
  snprintf(job, sizeof job, "shim-ipc-%d", (int)getpid());
  setenv("TAGMEM_PEER_DIR", dir, 1);
  setenv("TAGMEM_JOB", job, 1);
  driver();
  tagmem_status (*malloc_tagged)(void**, size_t, const char*, int, tagmem_stream) =
      sym("tagmem_malloc_tagged");
  tagmem_status (*offload)(const char* const*, size_t, int, tagmem_offload_mode) =
      sym("tagmem_offload");
  tagmem_status (*reload)(const char* const*, size_t, int) = sym("tagmem_reload");
  tagmem_status (*stats)(tagmem_ipc_stats*, size_t) = sym("tagmem_ipc_stats_get_sized");
  int (*get_handle)(ipc_handle*, void*) = sym("cudaIpcGetMemHandle");

  void* p = NULL;
  CHECK(malloc_tagged(&p, kBytes, "t", 0, NULL) == TAGMEM_SUCCESS);
  uint64_t seeds[2] = {(uint64_t)time(NULL) ^ (uint64_t)getpid() << 20, 0};
  seeds[1] = seeds[0] * 31 + 7;
  unsigned char* bytes = malloc(kBytes);
  unsigned char* now = malloc(kBytes);
  seeded(seeds[0], bytes, kBytes);
  CHECK(memcpy_htod((CUdeviceptr)p, bytes, kBytes) == CUDA_SUCCESS);
  ipc_handle h;
  CHECK(get_handle(&h, (char*)p + kInside) == 0);

  int to_child[2], from_child[2];
  if (pipe(to_child) || pipe(from_child)) return 2;
  pid_t pid = fork();
  if (pid == 0) {
    char in[16], out[16];
    snprintf(in, sizeof in, "%d", to_child[0]);
    snprintf(out, sizeof out, "%d", from_child[1]);
    execl("/proc/self/exe", argv[0], "importer", in, out, (char*)NULL);
    _exit(127);
  }
  CHECK(write(to_child[1], &h, sizeof h) == sizeof h);
  CHECK(write(to_child[1], seeds, sizeof seeds) == sizeof seeds);
  char c = 0;
  CHECK(read(from_child[0], &c, 1) == 1 && c == 'w');
  seeded(seeds[1], bytes, kBytes);
  CHECK(memcpy_dtoh(now, (CUdeviceptr)p, kBytes) == CUDA_SUCCESS);
  CHECK(memcmp(now, bytes, kBytes) == 0);
  const char* tag = "t";
  CHECK(offload(&tag, 1, 0, TAGMEM_BACKUP) == TAGMEM_ERROR_PEER); /* mapped over there */
  c = 'c';
  CHECK(write(to_child[1], &c, 1) == 1);
  CHECK(read(from_child[0], &c, 1) == 1 && c == 'd');
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  tagmem_ipc_stats s;
  for (int i = 0; i < 1000; ++i) {
    CHECK(stats(&s, sizeof s) == TAGMEM_SUCCESS);
    if (s.importers == 0) break;
    usleep(10000);
  }
  CHECK(s.importers == 0 && s.refused_peers == 1);
  CHECK(offload(&tag, 1, 0, TAGMEM_BACKUP) == TAGMEM_SUCCESS);
  CHECK(reload(&tag, 1, 0) == TAGMEM_SUCCESS);
  CHECK(memcpy_dtoh(now, (CUdeviceptr)p, kBytes) == CUDA_SUCCESS);
  CHECK(memcmp(now, bytes, kBytes) == 0);
  free(bytes);
  free(now);
  // Removed here, not by a shell: a child such as sh would load the preloaded shim too, which in
  // a sanitizer build needs the sanitizer runtime an uninstrumented program lacks.
  if (nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS) != 0) ++failures;
  if (failures == 0) printf("shim IPC: all checks passed\n");
  return failures ? 1 : 0;
}
