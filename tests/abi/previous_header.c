/* previous_header.c — a program built against the header of the previous release
 * (tests/abi/previous/tagmem/tagmem.h, whose structs are smaller than today's) and linked against
 * the library of this tree. It puts random guard bytes after each struct it hands the library and
 * checks that every call leaves them as they were, and that tagmem_init reads no field past the
 * old tagmem_config (the guard after it would be an absurd host_max_bytes, which init refuses).
 * Every check runs, so one run names every call that misbehaves; exits 1 if any did. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tagmem/tagmem.h" /* the previous release's: -I tests/abi/previous */

#ifdef TAGMEM_CONFIG_INIT
#error "built against today's tagmem.h: the previous release's must come first on the include path"
#endif

#define GUARD_BYTES 64

static unsigned char expected_guard[GUARD_BYTES];

static void fill_guard(unsigned char* guard) { memcpy(guard, expected_guard, GUARD_BYTES); }

static int check_guard(const unsigned char* guard, const char* what) {
  size_t changed = 0, last = 0;
  for (size_t i = 0; i < GUARD_BYTES; ++i) {
    if (guard[i] != expected_guard[i]) {
      ++changed;
      last = i;
    }
  }
  if (changed == 0) return 1;
  fprintf(stderr,
          "FAIL: %s wrote past the caller's struct: %zu guard bytes changed, up to byte %zu\n",
          what, changed, last);
  return 0;
}

static int expect_ok(tagmem_status s, const char* what) {
  if (s == TAGMEM_SUCCESS) return 1;
  fprintf(stderr, "FAIL: %s returned %s: %s\n", what, tagmem_status_string(s), tagmem_last_error());
  return 0;
}

int main(void) {
  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  srand(seed);
  for (size_t i = 0; i < GUARD_BYTES; ++i) expected_guard[i] = (unsigned char)(rand() & 0xff);
  expected_guard[7] |= 0x80; /* read as a size_t field, the first 8 bytes are beyond 2^48 */
  printf("guard seed %u\n", seed);

  struct {
    tagmem_config config;
    unsigned char guard[GUARD_BYTES];
  } c;
  fill_guard(c.guard);
  tagmem_config_init(&c.config);
  int failures = !check_guard(c.guard, "tagmem_config_init");
  fill_guard(c.guard); /* whatever happened above, init must not read the bytes after the struct */
  if (!expect_ok(tagmem_init(&c.config), "tagmem_init with the previous tagmem_config")) {
    ++failures; /* it read the guard as a field; go on with the defaults to check the rest */
    if (!expect_ok(tagmem_init(NULL), "tagmem_init(NULL)")) return 1;
  }

  void* p = NULL;
  const size_t size = 4096 + (size_t)(rand() % 4096);
  if (!expect_ok(tagmem_malloc_tagged(&p, size, "abi", 0, NULL), "tagmem_malloc_tagged")) return 1;

  struct {
    tagmem_tag_stats stats;
    unsigned char guard[GUARD_BYTES];
  } t;
  fill_guard(t.guard);
  if (!expect_ok(tagmem_tag_stats_get("abi", 0, &t.stats), "tagmem_tag_stats_get")) return 1;
  failures += !check_guard(t.guard, "tagmem_tag_stats_get");
  if (t.stats.state != TAGMEM_RESIDENT || t.stats.requested_bytes != size ||
      t.stats.live_allocations != 1 || t.stats.alloc_count != 1) {
    fprintf(stderr,
            "FAIL: tagmem_tag_stats_get: state %d, requested %zu (expected %zu), live %llu\n",
            (int)t.stats.state, t.stats.requested_bytes, size,
            (unsigned long long)t.stats.live_allocations);
    ++failures;
  }

  struct {
    tagmem_device_stats stats;
    unsigned char guard[GUARD_BYTES];
  } d;
  fill_guard(d.guard);
  if (!expect_ok(tagmem_device_stats_get(0, &d.stats), "tagmem_device_stats_get")) return 1;
  failures += !check_guard(d.guard, "tagmem_device_stats_get");
  if (d.stats.tags < 1 || d.stats.allocated_bytes < size || d.stats.device_total_bytes == 0) {
    fprintf(stderr, "FAIL: tagmem_device_stats_get: %llu tags, %zu allocated, %zu total\n",
            (unsigned long long)d.stats.tags, d.stats.allocated_bytes, d.stats.device_total_bytes);
    ++failures;
  }

  if (!expect_ok(tagmem_free(p, NULL), "tagmem_free")) return 1;
  if (!expect_ok(tagmem_shutdown(), "tagmem_shutdown")) return 1;
  if (failures) return 1;
  printf("previous header: no guard byte changed, every call succeeded\n");
  return 0;
}
