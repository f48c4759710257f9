/* thread_exit_c.c — tagmem's C ABI called from C11 thread-specific-storage destructors (pthread
 * key destructors underneath): of a thread that used tagmem during its life, and of one whose
 * first call is its destructor, over three rounds each (the destructor stores its value again).
 * Each destructor frees what it was given and allocates one block; the exit status is 0 only if
 * every call succeeded and the tag holds no bytes at the end (thread_exit_test.cpp checks the
 * bytes themselves). Note [heap at thread exit] in allocator/host/metadata_heap.cpp. */
#include <stdio.h>
#include <stdlib.h>
#include <threads.h>

#include "tagmem/tagmem.h"

enum { kRounds = 3, kBlocks = 24 };

static tss_t key;
static void* blocks[kBlocks * kRounds];
static int block_count;
static void* made[kRounds * 2];
static int made_count;
static int rounds_left;
static int failures;

static void call(tagmem_status s, const char* what) {
  if (s == TAGMEM_SUCCESS) return;
  fprintf(stderr, "thread_exit_c: %s: %s: %s\n", what, tagmem_status_string(s),
          tagmem_last_error());
  ++failures;
}

static void allocate(int count) {
  for (int i = 0; i < count; ++i) {
    void* p = NULL;
    call(tagmem_malloc_tagged(&p, 1 + (size_t)rand() % (i % 4 ? 50000 : (2u << 20)), "c_exit", 0,
                              NULL),
         "tagmem_malloc_tagged");
    if (p) blocks[block_count++] = p;
  }
}

/* Frees a third of what is left, allocates one block. */
static void destructor(void* value) {
  int n = block_count / 3 + 1;
  while (n-- > 0 && block_count > 0) call(tagmem_free(blocks[--block_count], NULL), "tagmem_free");
  void* p = NULL;
  call(tagmem_malloc_tagged(&p, 1 + (size_t)rand() % 100000, "c_exit", 0, NULL),
       "tagmem_malloc_tagged in a destructor");
  if (p) made[made_count++] = p;
  if (--rounds_left > 0) tss_set(key, value);
}

static int worker(void* arg) {
  if (arg) allocate(kBlocks);
  tss_set(key, &key);
  return 0;
}

static void run(int thread_calls_first) {
  if (!thread_calls_first) allocate(kBlocks);
  rounds_left = kRounds;
  thrd_t t;
  if (thrd_create(&t, worker, thread_calls_first ? &key : NULL) != thrd_success ||
      thrd_join(t, NULL) != thrd_success) {
    ++failures;
    return;
  }
  if (made_count != kRounds) {
    fprintf(stderr, "thread_exit_c: %d destructor rounds of %d\n", made_count, kRounds);
    ++failures;
  }
  while (block_count > 0) call(tagmem_free(blocks[--block_count], NULL), "tagmem_free");
  while (made_count > 0) call(tagmem_free(made[--made_count], NULL), "tagmem_free");
}

int main(void) {
  srand(12345);
  call(tagmem_init(NULL), "tagmem_init");
  if (tss_create(&key, destructor) != thrd_success) return 1;
  run(1);
  run(0);
  tagmem_tag_stats st = {0};
  call(tagmem_tag_stats_get("c_exit", 0, &st), "tagmem_tag_stats_get");
  if (st.allocated_bytes != 0) {
    fprintf(stderr, "thread_exit_c: %zu bytes still allocated\n", st.allocated_bytes);
    ++failures;
  }
  call(tagmem_shutdown(), "tagmem_shutdown");
  printf("thread_exit_c: %d failed calls\n", failures);
  return failures ? 1 : 0;
}
