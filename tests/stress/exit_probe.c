/* exit_probe.c — a process that leaves while tagmem's background threads are still at work, as
 * a program that never calls tagmem_shutdown does: the registry is never destroyed, and the
 * release or pinning thread may be inside the driver while the process exits (docs/design.md).
 *
 *   tagmem_exit_probe discard|swap|reserve <MiB>
 *
 *   discard  <MiB> in one DISCARD tag, offloaded: the release thread hands it back
 *   swap     <MiB> a side, the engine offloaded with BACKUP and swapped in for the trainer: the
 *            release thread hands the trainer's memory back
 *   reserve  tagmem_host_reserve(<MiB>, wait=0): the pinning thread pins in the background
 *
 * Then main returns at once. The exit status is 0 only if every call succeeded and the process
 * left cleanly; a crash or a hang at exit is the failure this probe exists to catch
 * (tests/stress/exit_probe.sh runs it in a loop). Written in C: the C ABI alone, linked to the
 * shared libtagmem. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tagmem/tagmem.h"

static int ok(tagmem_status s, const char* what) {
  if (s == TAGMEM_SUCCESS) return 1;
  fprintf(stderr, "exit_probe: %s: %s: %s\n", what, tagmem_status_string(s), tagmem_last_error());
  return 0;
}

/* `count` allocations of `bytes` in `tag` (each with physical memory of its own). */
static int fill(const char* tag, int count, size_t bytes) {
  for (int i = 0; i < count; ++i) {
    void* p = NULL;
    if (!ok(tagmem_malloc_tagged(&p, bytes, tag, 0, NULL), "tagmem_malloc_tagged")) return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3 || atoi(argv[2]) <= 0) {
    fprintf(stderr, "usage: %s discard|swap|reserve <MiB>\n", argv[0]);
    return 2;
  }
  const size_t mib = (size_t)atoi(argv[2]);
  const size_t piece = 256u << 20; /* several mappings, so that releases take a while */
  const int pieces = (int)((mib << 20) / piece) + 1;
  const char* kv[] = {"kv_cache"};
  const char* engine[] = {"engine"};
  const char* trainer[] = {"trainer"};
  if (strcmp(argv[1], "discard") == 0) {
    if (!fill("kv_cache", pieces, piece)) return 1;
    if (!ok(tagmem_offload(kv, 1, 0, TAGMEM_DISCARD), "tagmem_offload")) return 1;
  } else if (strcmp(argv[1], "swap") == 0) {
    if (!fill("engine", pieces, piece)) return 1;
    if (!ok(tagmem_offload(engine, 1, 0, TAGMEM_BACKUP), "tagmem_offload")) return 1;
    if (!fill("trainer", pieces, piece)) return 1;
    if (!ok(tagmem_swap(trainer, 1, engine, 1, 0, TAGMEM_BACKUP), "tagmem_swap")) return 1;
  } else if (strcmp(argv[1], "reserve") == 0) {
    if (!ok(tagmem_host_reserve(mib << 20, 0), "tagmem_host_reserve")) return 1;
  } else {
    fprintf(stderr, "exit_probe: unknown mode %s\n", argv[1]);
    return 2;
  }
  return 0; /* no tagmem_shutdown: the background thread may still be inside the driver */
}
