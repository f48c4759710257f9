// thread_exit_test.cpp — tagmem called from a thread's exit destructors, after the thread's
// metadata heap is gone or before it ever had one (Note [heap at thread exit] in
// allocator/host/metadata_heap.cpp): C++ thread_local destructors and pthread key destructors,
// over several rounds of the latter, free and allocate; every call succeeds and every byte of the
// allocations left alive stays.
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "api/c_error.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

class ThreadExit : public tagmem_test {};

// What an exit destructor does: frees `to_free`, then allocates and fills one block per round
// (which the test frees later, from the main thread), counting every failed call.
struct exit_work {
  std::vector<void*> to_free;
  std::vector<filled> made;  // allocated by the destructor
  std::mt19937_64 rng;
  std::atomic<int> failures{0};
  std::atomic<int> calls{0};
  std::mutex mu;

  void run_once() {
    std::lock_guard<std::mutex> lock(mu);
    for (void* p : to_free) {
      ++calls;
      if (tagmem_free(p, nullptr) != TAGMEM_SUCCESS) ++failures;
    }
    to_free.clear();
    const std::size_t size = 1 + rng() % (1u << 20);
    void* p = nullptr;
    ++calls;
    if (tagmem_malloc_tagged(&p, size, "exit", 0, nullptr) != TAGMEM_SUCCESS) {
      ++failures;
      return;
    }
    made.push_back({p, random_bytes(rng, size)});
    write_device(p, made.back().bytes.data(), size);
  }
};

// Allocations in tag "exit": half for the destructor to free, half kept and checked.
void split(std::mt19937_64& rng, exit_work& work, std::vector<filled>& kept) {
  std::vector<filled> all = fill(rng, "exit", 24, 1 + rng() % (3u << 20));
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i % 2)
      work.to_free.push_back(all[i].ptr);
    else
      kept.push_back(std::move(all[i]));
  }
  // Several sizes, so that frees land in distinct size classes of the pool.
  for (int i = 0; i < 16; ++i) {
    void* p = nullptr;
    TAGMEM_OK(tagmem_malloc_tagged(&p, 1 + rng() % 50000, "exit", 0, nullptr));
    work.to_free.push_back(p);
  }
}

void check_after(exit_work& work, const std::vector<filled>& kept, int rounds) {
  EXPECT_EQ(work.failures.load(), 0) << tagmem_last_error();
  EXPECT_EQ(work.made.size(), std::size_t(rounds));
  EXPECT_EQ(corrupted(kept), 0u);
  EXPECT_EQ(corrupted(work.made), 0u);
  free_all(work.made);
  free_all(kept);
  tagmem_tag_stats s{};
  TAGMEM_OK(tagmem_tag_stats_get("exit", 0, &s));
  EXPECT_EQ(s.allocated_bytes, 0u);
}

exit_work* g_tls_work = nullptr;

struct tls_releaser {
  ~tls_releaser() { g_tls_work->run_once(); }
};

TEST_F(ThreadExit, ThreadLocalMadeBeforeTheFirstCallFreesAfterTheHeapIsGone) {
  auto rng = rng_for_test();
  exit_work work;
  work.rng.seed(rng());
  g_tls_work = &work;
  std::vector<filled> kept;
  std::thread t([&] {
    thread_local tls_releaser releaser;  // constructed first: destroyed after tagmem's own
    (void)releaser;
    split(rng, work, kept);
  });
  t.join();
  check_after(work, kept, 1);
}

// A pthread key whose destructor runs `rounds` times (it sets its value again each time; glibc
// runs up to PTHREAD_DESTRUCTOR_ITERATIONS rounds), after the thread_local destructors and
// before or after mimalloc's own cleanup of the thread.
struct key_case {
  pthread_key_t key;
  exit_work* work;
  std::atomic<int> rounds_left;
};
key_case* g_key_case = nullptr;

void key_destructor(void* value) {
  g_key_case->work->run_once();
  if (--g_key_case->rounds_left > 0) pthread_setspecific(g_key_case->key, value);
}

void run_key_case(std::mt19937_64& rng, bool thread_calls_tagmem_first, int rounds) {
  exit_work work;
  work.rng.seed(rng());
  std::vector<filled> kept;
  key_case kc;
  kc.work = &work;
  kc.rounds_left = rounds;
  // Made after tagmem's init, so that it runs after tagmem's key in each round.
  ASSERT_EQ(pthread_key_create(&kc.key, key_destructor), 0);
  g_key_case = &kc;
  if (!thread_calls_tagmem_first) split(rng, work, kept);  // the thread makes no call before exit
  std::thread t([&] {
    if (thread_calls_tagmem_first) split(rng, work, kept);
    pthread_setspecific(kc.key, &kc);
  });
  t.join();
  pthread_key_delete(kc.key);
  check_after(work, kept, rounds);
}

TEST_F(ThreadExit, KeyDestructorOfAThreadThatUsedTagmem) {
  auto rng = rng_for_test();
  run_key_case(rng, true, 3);
}

TEST_F(ThreadExit, KeyDestructorIsTheThreadsFirstCall) {
  auto rng = rng_for_test();
  run_key_case(rng, false, 3);
}

// The thread's tag scope and last error are thread_locals too, destroyed before a thread_local
// made before them: a destructor after them still allocates (in the default tag: the scope
// is gone with its thread), gets SCOPE_EMPTY from a pop, and reads a failure's message.
struct scope_and_error_user {
  std::atomic<int>* failures;
  std::string* tag_seen;
  std::string* message_seen;
  ~scope_and_error_user() {
    void* p = nullptr;
    if (tagmem_malloc(&p, 4096, 0, nullptr) != TAGMEM_SUCCESS) ++*failures;
    char tag[TAGMEM_MAX_TAG_NAME + 1] = {};
    if (tagmem_pointer_info(p, tag, sizeof tag, nullptr, nullptr, nullptr) != TAGMEM_SUCCESS)
      ++*failures;
    *tag_seen = tag;
    if (tagmem_free(p, nullptr) != TAGMEM_SUCCESS) ++*failures;
    if (tagmem_pop_tag() != TAGMEM_ERROR_SCOPE_EMPTY) ++*failures;
    int on_stack = 0;
    if (tagmem_free(&on_stack, nullptr) == TAGMEM_SUCCESS) ++*failures;
    *message_seen = tagmem_last_error();
  }
};

TEST_F(ThreadExit, ScopeAndLastErrorWorkAfterTheirThreadLocalsAreGone) {
  std::atomic<int> failures{0};
  std::string tag_seen, message_seen;
  std::thread t([&] {
    thread_local scope_and_error_user user{&failures, &tag_seen, &message_seen};
    (void)user;
    TAGMEM_OK(tagmem_push_tag("scoped-at-exit"));
    TAGMEM_OK(tagmem_push_tag("scoped-at-exit-with-a-name-longer-than-a-short-string"));
    int on_stack = 0;  // an error during the thread's life, with a message of some length
    EXPECT_NE(tagmem_free(&on_stack, nullptr), TAGMEM_SUCCESS);
    EXPECT_GT(std::string(tagmem_last_error()).size(), 16u);
  });
  t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tag_seen, TAGMEM_DEFAULT_TAG);
  EXPECT_NE(message_seen.find("not"), std::string::npos) << message_seen;
}

// A thread whose first tagmem call fails, in a pthread key destructor: the message is there to
// read, and nothing of it is left behind (under LeakSanitizer, a per-thread string made that late
// is reported as a leak: glibc never destroys it).
pthread_key_t g_failing_key;
std::string* g_failing_message = nullptr;
std::atomic<int> g_failing_status{TAGMEM_SUCCESS};

void failing_key_destructor(void*) {
  int on_stack = 0;
  g_failing_status = tagmem_free(&on_stack, nullptr);
  *g_failing_message = tagmem_last_error();
}

TEST_F(ThreadExit, FailingFirstCallInAKeyDestructorLeavesItsMessageAndNoMemory) {
  std::string message;
  g_failing_message = &message;
  ASSERT_EQ(pthread_key_create(&g_failing_key, failing_key_destructor), 0);
  std::thread t([] { pthread_setspecific(g_failing_key, &g_failing_key); });
  t.join();
  pthread_key_delete(g_failing_key);
  EXPECT_NE(g_failing_status.load(), TAGMEM_SUCCESS);
  EXPECT_NE(message.find("not"), std::string::npos) << message;
}

// A message longer than the per-thread buffer is cut, says so, and the next one replaces it whole.
TEST_F(ThreadExit, LongMessagesAreCutAndSaySo) {
  const std::string long_text = "start " + std::string(5000, 'x') + " end";
  EXPECT_EQ(record_c_error(TAGMEM_ERROR_INVALID_ARGUMENT, long_text),
            TAGMEM_ERROR_INVALID_ARGUMENT);
  const std::string cut = tagmem_last_error();
  EXPECT_GE(cut.size(), 1000u);
  EXPECT_LT(cut.size(), long_text.size());
  EXPECT_EQ(cut.rfind("start ", 0), 0u);
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
  int on_stack = 0;
  EXPECT_NE(tagmem_free(&on_stack, nullptr), TAGMEM_SUCCESS);
  const std::string next = tagmem_last_error();
  EXPECT_LT(next.size(), 200u);
  EXPECT_EQ(next.find("..."), std::string::npos) << next;
  EXPECT_EQ(next.find('x'), std::string::npos) << next;
}

}  // namespace
}  // namespace tagmem::test
