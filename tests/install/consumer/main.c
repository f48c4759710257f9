/* A program that uses an installed tagmem as any C project would: through find_package(tagmem) or
 * pkg-config, nothing from the source tree. It initialises tagmem on the driver TAGMEM_LIBCUDA
 * names (the emulated one in CI), allocates in a tag, offloads it with a backup, finds its bytes on
 * the host, reloads it at the same address, and exits non-zero with tagmem's message on any
 * failure. */
#include <stdio.h>
#include <string.h>
#include <tagmem/tagmem.h>

static int check(tagmem_status status, const char* what) {
  if (status == TAGMEM_SUCCESS) return 0;
  fprintf(stderr, "consumer: %s: %s: %s\n", what, tagmem_status_string(status),
          tagmem_last_error());
  return 1;
}

int main(void) {
  const size_t bytes = (size_t)3 << 20;
  const char* tags[] = {"consumer"};
  void* ptr = NULL;
  void* host = NULL;
  size_t host_bytes = 0;
  char tag[TAGMEM_MAX_TAG_NAME + 1];
  int device = -1;
  void* base = NULL;
  size_t size = 0;
  tagmem_tag_stats stats;

  if (check(tagmem_init(NULL), "tagmem_init") ||
      check(tagmem_malloc_tagged(&ptr, bytes, "consumer", 0, NULL), "tagmem_malloc_tagged") ||
      check(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), "tagmem_offload") ||
      check(tagmem_host_view(ptr, 0, &host, &host_bytes), "tagmem_host_view") ||
      check(tagmem_tag_stats_get("consumer", 0, &stats), "tagmem_tag_stats_get")) {
    return 1;
  }
  if (host == NULL || host_bytes < bytes || stats.state != TAGMEM_OFFLOADED_BACKUP ||
      stats.mapped_bytes != 0) {
    fprintf(stderr,
            "consumer: after the offload: host view %p of %zu bytes, state %d, %zu mapped\n", host,
            host_bytes, (int)stats.state, stats.mapped_bytes);
    return 1;
  }
  if (check(tagmem_reload(tags, 1, 0), "tagmem_reload") ||
      check(tagmem_pointer_info(ptr, tag, sizeof tag, &device, &base, &size),
            "tagmem_pointer_info")) {
    return 1;
  }
  if (strcmp(tag, "consumer") != 0 || base != ptr || size < bytes) {
    fprintf(stderr, "consumer: after the reload: tag '%s', base %p (allocated %p), size %zu\n", tag,
            base, ptr, size);
    return 1;
  }
  if (check(tagmem_free(ptr, NULL), "tagmem_free") || check(tagmem_shutdown(), "tagmem_shutdown")) {
    return 1;
  }
  printf("consumer: ok (metadata heap: %s)\n", tagmem_metadata_heap());
  return 0;
}
