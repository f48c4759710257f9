// bounded_wait.cpp — driver waits on helper threads, with deadlines (see header).
//
// Note [who runs the hand-over]: the caller and the helper decide under the job's mutex. The
// helper, when its wait returns, either finds the caller still waiting (then the caller owns
// the outcome) or finds the job abandoned (then it runs the hand-over itself, and only after
// that marks the job ended, so that settling a late wait also waits for its hand-over).
#include "bounded_wait.hpp"

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "api/runtime.hpp"

namespace tagmem::nccl {
namespace {

struct job {
  std::mutex mutex;
  std::condition_variable changed;
  bool ended = false;      // the wait returned (and, for an abandoned job, its hand-over ran)
  bool abandoned = false;  // the caller's deadline passed first
  CUresult status = CUDA_SUCCESS;
  std::function<void()> if_late;
};

std::mutex g_mutex;
std::map<int, std::shared_ptr<job>>& late_jobs() {
  static auto* m = new std::map<int, std::shared_ptr<job>>;  // leaked: helpers may outlive exit
  return *m;
}

bool wait_until_ended(job& j, deadline until) {
  std::unique_lock lock(j.mutex);
  return j.changed.wait_until(lock, until, [&] { return j.ended; });
}

void run(const std::shared_ptr<job>& j, std::shared_ptr<job> before, CUcontext context,
         const std::function<CUresult()>& wait) {
  if (before) {
    std::unique_lock lock(before->mutex);
    before->changed.wait(lock, [&] { return before->ended; });
  }
  CUresult status = wait();
  std::function<void()> hand_over;
  {
    std::lock_guard lock(j->mutex);  // Note [who runs the hand-over]
    j->status = status;
    if (j->abandoned) {
      hand_over = std::move(j->if_late);
    } else {
      j->ended = true;
      j->changed.notify_all();
      return;
    }
  }
  if (hand_over) {
    driver::api().cuCtxSetCurrent(context);  // for the hand-over's calls; they report their own
    hand_over();
  }
  std::lock_guard lock(j->mutex);
  j->ended = true;
  j->changed.notify_all();
}

}  // namespace

deadline deadline_after(int timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

wait_outcome wait_bounded(int device, CUcontext context, deadline until,
                          std::function<CUresult()> wait, std::function<void()> if_late) {
  auto j = std::make_shared<job>();
  std::shared_ptr<job> before;
  {
    std::lock_guard lock(g_mutex);
    auto it = late_jobs().find(device);
    if (it != late_jobs().end()) before = it->second;
  }
  try {
    std::thread(run, j, before, context, wait).detach();
  } catch (const std::system_error&) {
    // No thread: wait here. Unbounded, but giving back memory that copies may still use, or
    // reporting a wait that never happened, would be worse.
    CUcontext previous = nullptr;
    driver::api().cuCtxGetCurrent(&previous);
    run(j, before, context, wait);
    driver::api().cuCtxSetCurrent(previous);
  }
  {
    std::unique_lock lock(j->mutex);
    if (j->changed.wait_until(lock, until, [&] { return j->ended; })) return {true, j->status};
    j->abandoned = true;
    j->if_late = std::move(if_late);
  }
  std::lock_guard lock(g_mutex);
  late_jobs()[device] = j;  // it waited for `before`, so that one is no longer needed
  return {false, CUDA_SUCCESS};
}

bool settle_late_wait(int device, deadline until) {
  std::shared_ptr<job> j;
  {
    std::lock_guard lock(g_mutex);
    auto it = late_jobs().find(device);
    if (it == late_jobs().end()) return true;
    j = it->second;
  }
  if (!wait_until_ended(*j, until)) return false;
  std::lock_guard lock(g_mutex);
  auto it = late_jobs().find(device);
  if (it != late_jobs().end() && it->second == j) late_jobs().erase(it);
  return true;
}

bool late_wait_running() {
  std::lock_guard lock(g_mutex);
  for (const auto& [d, j] : late_jobs()) {
    std::lock_guard job_lock(j->mutex);
    if (!j->ended) return true;
  }
  return false;
}

bool settle_late_waits(deadline until, int* device) {
  std::vector<int> devices;
  {
    std::lock_guard lock(g_mutex);
    for (const auto& [d, j] : late_jobs()) devices.push_back(d);
  }
  for (int d : devices) {
    if (!settle_late_wait(d, until)) {
      *device = d;
      return false;
    }
  }
  return true;
}

}  // namespace tagmem::nccl
