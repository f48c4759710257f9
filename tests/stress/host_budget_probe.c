/* host_budget_probe.c — a BACKUP offload measured against the host memory the process may still
 * use, run by host_budget_cgroup.sh inside a memory cgroup.
 *
 *   tagmem_host_budget_probe <MiB> <small MiB>    (a cgroup smaller than tag plus backup)
 *   tagmem_host_budget_probe <MiB> fits           (a cgroup where both fit once the kernel
 *                                                  reclaims its file cache)
 *
 * Fills a tag of <MiB> with seeded pseudo-random bytes and offloads it with BACKUP. In the first
 * form the pinned host store cannot grow by <MiB> inside the cgroup, so the offload must fail with
 * TAGMEM_ERROR_HOST_OUT_OF_MEMORY (not be killed by the kernel), and the tag must stay resident
 * with every byte as written; then a tag of <small MiB> must offload and reload intact. In the
 * second form the offload must succeed (the budget counts the cache the kernel reclaims, Note
 * [host budget]) and the reload must restore every byte. Exit status: 0 when all of that holds,
 * 1 when the large offload went the other way, 2 for any other failure.
 * The bytes are checked through the CUDA driver that tagmem loaded (TAGMEM_LIBCUDA). Written in
 * C against the shared libtagmem, as an application would be. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tagmem/tagmem.h"

#define PIECE ((size_t)8 << 20) /* bytes generated and checked at a time: little host memory */

typedef CUresult (*htod_fn)(CUdeviceptr, const void*, size_t);
typedef CUresult (*dtoh_fn)(void*, CUdeviceptr, size_t);
typedef CUresult (*retain_fn)(CUcontext*, CUdevice);
typedef CUresult (*set_fn)(CUcontext);

static htod_fn htod;
static dtoh_fn dtoh;

static int ok(tagmem_status s, const char* what) {
  if (s == TAGMEM_SUCCESS) return 1;
  fprintf(stderr, "host_budget_probe: %s: %s: %s\n", what, tagmem_status_string(s),
          tagmem_last_error());
  return 0;
}

/* splitmix64: the bytes of piece `index` of a tag, reproducible from `seed`. */
static void generate(unsigned char* out, size_t n, uint64_t seed, size_t index) {
  uint64_t x = seed ^ (0x9e3779b97f4a7c15ull * (index + 1));
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    memcpy(out + i, &z, n - i < 8 ? n - i : 8);
  }
}

/* Writes (check == 0) or compares (check != 0) the seeded bytes of [ptr, ptr + bytes). Returns
 * how many bytes differ (or -1 when a copy fails). */
static long long pass(void* ptr, size_t bytes, uint64_t seed, int check, unsigned char* want,
                      unsigned char* got) {
  long long wrong = 0;
  for (size_t off = 0, i = 0; off < bytes; off += PIECE, ++i) {
    size_t n = bytes - off < PIECE ? bytes - off : PIECE;
    generate(want, n, seed, i);
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)ptr + off;
    if (!check) {
      if (htod(at, want, n) != CUDA_SUCCESS) return -1;
      continue;
    }
    if (dtoh(got, at, n) != CUDA_SUCCESS) return -1;
    for (size_t k = 0; k < n; ++k) wrong += want[k] != got[k];
  }
  return wrong;
}

static int bind_driver(void) {
  const char* path = getenv("TAGMEM_LIBCUDA");
  void* lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) return 0;
  htod = (htod_fn)dlsym(lib, "cuMemcpyHtoD_v2");
  dtoh = (dtoh_fn)dlsym(lib, "cuMemcpyDtoH_v2");
  retain_fn retain = (retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
  set_fn set = (set_fn)dlsym(lib, "cuCtxSetCurrent");
  CUcontext ctx = NULL;
  return htod && dtoh && retain && set && retain(&ctx, 0) == CUDA_SUCCESS &&
         set(ctx) == CUDA_SUCCESS;
}

int main(int argc, char** argv) {
  const int fits = argc == 3 && strcmp(argv[2], "fits") == 0;
  if (argc != 3 || atoi(argv[1]) <= 0 || (!fits && atoi(argv[2]) <= 0)) {
    fprintf(stderr, "usage: %s <MiB> <small MiB> | %s <MiB> fits\n", argv[0], argv[0]);
    return 2;
  }
  const size_t big = (size_t)atoi(argv[1]) << 20;
  const size_t small = fits ? 0 : (size_t)atoi(argv[2]) << 20;
  const uint64_t seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
  /* Static, not malloc'd: the probe returns from many places, and a sanitizer build would count
   * buffers still held at such a return as leaks. */
  static unsigned char want[PIECE], got[PIECE];
  void *p = NULL, *q = NULL;
  if (!ok(tagmem_init(NULL), "tagmem_init")) return 2;
  if (!bind_driver()) {
    fprintf(stderr, "host_budget_probe: cannot bind the driver's copy functions\n");
    return 2;
  }
  printf("seed %llu\n", (unsigned long long)seed);
  if (!ok(tagmem_malloc_tagged(&p, big, "big", 0, NULL), "tagmem_malloc_tagged big") ||
      pass(p, big, seed, 0, want, got) != 0)
    return 2;
  const char* big_tag[] = {"big"};
  tagmem_status s = tagmem_offload(big_tag, 1, 0, TAGMEM_BACKUP);
  if (fits) {
    if (s != TAGMEM_SUCCESS) {
      fprintf(stderr, "host_budget_probe: a %zu MiB BACKUP offload failed: %s: %s\n", big >> 20,
              tagmem_status_string(s), tagmem_last_error());
      return s == TAGMEM_ERROR_HOST_OUT_OF_MEMORY ? 1 : 2;
    }
    if (!ok(tagmem_reload(big_tag, 1, 0), "tagmem_reload big")) return 2;
    long long wrong = pass(p, big, seed, 1, want, got);
    printf("a %zu MiB BACKUP offload and reload: %lld bytes differ\n", big >> 20, wrong);
    return wrong == 0 && ok(tagmem_shutdown(), "tagmem_shutdown") ? 0 : 2;
  }
  if (s == TAGMEM_SUCCESS) {
    fprintf(stderr, "host_budget_probe: a %zu MiB BACKUP offload succeeded\n", big >> 20);
    return 1;
  }
  printf("large offload: %s: %s\n", tagmem_status_string(s), tagmem_last_error());
  if (s != TAGMEM_ERROR_HOST_OUT_OF_MEMORY) return 2;
  tagmem_tag_stats st;
  if (!ok(tagmem_tag_stats_get("big", 0, &st), "tagmem_tag_stats_get")) return 2;
  long long wrong = pass(p, big, seed, 1, want, got);
  printf("tag 'big' after the failed offload: %s, %lld of %zu bytes differ\n",
         st.state == TAGMEM_RESIDENT ? "resident" : "NOT resident", wrong, big);
  if (st.state != TAGMEM_RESIDENT || wrong != 0) return 2;
  const char* small_tag[] = {"small"};
  if (!ok(tagmem_malloc_tagged(&q, small, "small", 0, NULL), "tagmem_malloc_tagged small") ||
      pass(q, small, seed + 1, 0, want, got) != 0 ||
      !ok(tagmem_offload(small_tag, 1, 0, TAGMEM_BACKUP), "tagmem_offload small") ||
      !ok(tagmem_reload(small_tag, 1, 0), "tagmem_reload small"))
    return 2;
  wrong = pass(q, small, seed + 1, 1, want, got);
  printf("a %zu MiB BACKUP offload and reload: %lld bytes differ\n", small >> 20, wrong);
  if (wrong != 0) return 2;
  tagmem_device_stats ds;
  if (!ok(tagmem_device_stats_get(0, &ds), "tagmem_device_stats_get")) return 2;
  printf("host store: %zu bytes pinned\n", ds.host_pinned_bytes);
  return ok(tagmem_shutdown(), "tagmem_shutdown") ? 0 : 2;
}
