// fork_test.cpp — a child forked while tagmem's threads are at work gets TAGMEM_ERROR_FORKED from
// every C entry point and exits, never hangs (Note [fork] in fork_guard.hpp), and the parent's
// tagmem goes on unharmed. Each child runs under a bound: one still running after it is killed,
// which fails the test. Runs on both drivers.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = 1u << 20;

// Runs `child` in a forked process, which leaves with _exit and the count of failed checks as its
// status. _exit, as a forked child of a multithreaded program should (Python's multiprocessing
// does the same): std::exit would run every library's exit handlers in a copy that has lost
// their threads, and on the H200 such a child died of SIGSEGV in exit after an earlier test of
// the process had used per-thread default streams. Returns a description of how it ended ("" when
// it exited 0); a child that outlives `bound` is killed with SIGKILL.
std::string run_forked(const std::function<int()>& child,
                       std::chrono::seconds bound = std::chrono::seconds(60)) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return std::string("fork failed: ") + std::strerror(errno);
  if (pid == 0) {
    const int failed = child();
    std::fflush(nullptr);
    _exit(failed);
  }
  const auto deadline = std::chrono::steady_clock::now() + bound;
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "the child hung: killed after " + std::to_string(bound.count()) + " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFSIGNALED(status)) return "the child died of signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0) {
    return std::to_string(WEXITSTATUS(status)) + " calls in the child did not fail as expected";
  }
  return "";
}

// In the child: whether `s` is TAGMEM_ERROR_FORKED with a message that says so.
int refused(const char* call, tagmem_status s) {
  const char* message = tagmem_last_error();
  if (s == TAGMEM_ERROR_FORKED && std::strstr(message, "fork()") &&
      std::strstr(message, "parent process")) {
    return 0;
  }
  std::fprintf(stderr, "forked child: %s returned %s: %s\n", call, tagmem_status_string(s),
               message);
  return 1;
}

// Every entry point that acts, in the child; the first one given first.
int every_call_refused(const std::function<int()>& first, void* parent_ptr) {
  int bad = first();
  const char* tags[] = {"fork_resident"};
  const char* gone[] = {"fork_discarded"};
  void* p = nullptr;
  tagmem_tag_stats ts{};
  tagmem_device_stats ds{};
  char names[4][TAGMEM_MAX_TAG_NAME + 1];
  std::size_t count = 0;
  char tag[TAGMEM_MAX_TAG_NAME + 1];
  bad += refused("tagmem_host_trim", tagmem_host_trim(0));
  bad += refused("tagmem_wait_released", tagmem_wait_released(0));
  bad += refused("tagmem_release_physical", tagmem_release_physical(0));
  bad +=
      refused("tagmem_tag_plan_offload", tagmem_tag_plan_offload("fork_planned", 0, TAGMEM_BACKUP));
  bad += refused("tagmem_malloc", tagmem_malloc(&p, MiB, 0, nullptr));
  bad += refused("tagmem_malloc_tagged", tagmem_malloc_tagged(&p, MiB, "child", 0, nullptr));
  bad += refused("tagmem_free", tagmem_free(parent_ptr, nullptr));
  bad += refused("tagmem_pointer_info",
                 tagmem_pointer_info(parent_ptr, tag, sizeof tag, nullptr, nullptr, nullptr));
  bad += refused("tagmem_offload", tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  bad += refused("tagmem_reload", tagmem_reload(gone, 1, 0));
  bad += refused("tagmem_swap", tagmem_swap(tags, 1, gone, 1, 0, TAGMEM_BACKUP));
  bad += refused("tagmem_empty_cache", tagmem_empty_cache(0));
  bad += refused("tagmem_host_reserve", tagmem_host_reserve(4 * MiB, 1));
  bad += refused("tagmem_tag_stats_get", tagmem_tag_stats_get("fork_resident", 0, &ts));
  bad += refused("tagmem_device_stats_get", tagmem_device_stats_get(0, &ds));
  bad += refused("tagmem_list_tags", tagmem_list_tags(0, names, 4, &count));
  bad += refused("tagmem_push_tag", tagmem_push_tag("child"));
  bad += refused("tagmem_pop_tag", tagmem_pop_tag());
  bad += refused("tagmem_init", tagmem_init(nullptr));
  bad += refused("tagmem_shutdown", tagmem_shutdown());
  bad += refused("tagmem_host_trim again", tagmem_host_trim(0));
  return bad;
}

// A resident tag with random bytes, a DISCARD-offloaded tag whose memory the release thread is
// giving back, the host store pinning 1 GiB in the background and a tag planned for BACKUP
// being pinned ahead (Note [pin ahead]): then a fork.
class Fork : public tagmem_test {
 protected:
  void SetUp() override {
    tagmem_test::SetUp();
    rng_ = rng_for_test();
    resident_ = fill(rng_, "fork_resident", 2, 4 * MiB);
    fill(rng_, "fork_discarded", 8, 8 * MiB);
    const char* gone[] = {"fork_discarded"};
    TAGMEM_OK(tagmem_offload(gone, 1, 0, TAGMEM_DISCARD));
    TAGMEM_OK(tagmem_host_reserve(1024 * MiB, 0));
    TAGMEM_OK(tagmem_tag_plan_offload("fork_planned", 0, TAGMEM_BACKUP));
    fill(rng_, "fork_planned", 4, 64 * MiB);
  }

  // The parent's tagmem still works after the child left.
  void parent_unharmed() {
    TAGMEM_OK(tagmem_host_trim(0));
    TAGMEM_OK(tagmem_wait_released(0));
    EXPECT_EQ(corrupted(resident_), 0u);
    const char* tags[] = {"fork_resident"};
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
    EXPECT_EQ(corrupted(resident_), 0u);
  }

  std::mt19937_64 rng_;
  std::vector<filled> resident_;
};

// The call that hung before Note [fork], made first in the child; then every other one.
struct first_call {
  const char* name;
  tagmem_status (*call)();
};

class ForkFirstCall : public Fork, public ::testing::WithParamInterface<first_call> {};

TEST_P(ForkFirstCall, FailsInTheChildAsDoesEveryOtherCall) {
  void* ptr = resident_[0].ptr;
  const first_call first = GetParam();
  EXPECT_EQ(run_forked([ptr, first] {
              return every_call_refused([first] { return refused(first.name, first.call()); }, ptr);
            }),
            "");
  parent_unharmed();
}

INSTANTIATE_TEST_SUITE_P(
    Fork, ForkFirstCall,
    ::testing::Values(  // trim during a background reserve, wait_released after a DISCARD
        first_call{"tagmem_host_trim", [] { return tagmem_host_trim(0); }},
        first_call{"tagmem_wait_released", [] { return tagmem_wait_released(0); }},
        first_call{"tagmem_tag_plan_offload",
                   [] { return tagmem_tag_plan_offload("fork_planned", 0, TAGMEM_BACKUP); }}),
    [](const ::testing::TestParamInfo<first_call>& info) { return std::string(info.param.name); });

TEST_F(Fork, GrandchildIsRefusedToo) {
  EXPECT_EQ(run_forked([] {
              std::string how = run_forked(  // killed before the child would be
                  [] { return refused("tagmem_host_trim", tagmem_host_trim(0)); },
                  std::chrono::seconds(20));
              if (!how.empty()) std::fprintf(stderr, "grandchild: %s\n", how.c_str());
              return how.empty() ? 0 : 1;
            }),
            "");
  parent_unharmed();
}

}  // namespace
}  // namespace tagmem::test
