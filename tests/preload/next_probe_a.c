/* next_probe_a.c — linked before next_probe_b.c: dlsym(RTLD_NEXT) from here must find b's
 * definition, as it does without the shim (Note [dlsym tail jump]). Both libraries define the
 * symbol with the version TAGMEM_PROBE_1 (next_probe.map), so a search that wrongly started
 * after the shim instead of after this library would find this library's own definition, by
 * either function. The lookups are not tail calls: glibc identifies the caller by the return
 * address, so a tail call would make the caller of these functions the one searching. */
#define _GNU_SOURCE
#include <dlfcn.h>

int tagmem_probe_value(void) { return 1; }

void* tagmem_probe_next(void) {
  void* volatile f = dlsym(RTLD_NEXT, "tagmem_probe_value");
  return f;
}

void* tagmem_probe_next_versioned(void) {
  void* volatile f = dlvsym(RTLD_NEXT, "tagmem_probe_value", "TAGMEM_PROBE_1");
  return f;
}
