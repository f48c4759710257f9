// early_offloads.cpp — offloads that return once their copies are queued (Note [early return]).
#include "registry/early_offloads.hpp"

#include <cstdlib>
#include <set>

#include "base/error.hpp"
#include "observe/log.hpp"

namespace tagmem {
namespace {

// The live instances, for the atexit handler; registered once, on the first instance.
std::mutex g_live_mutex;
std::set<early_offloads*>* g_live = nullptr;  // never destroyed: atexit handlers may outlive it

void at_exit() { early_offloads::wait_all_live(); }

}  // namespace

early_offloads::early_offloads() {
  std::lock_guard lock(g_live_mutex);
  if (!g_live) {
    g_live = new std::set<early_offloads*>();
    std::atexit(at_exit);
  }
  g_live->insert(this);
}

early_offloads::~early_offloads() {
  {
    std::unique_lock lock(mutex_);
    join_where(-1, lock);
  }
  std::lock_guard lock(g_live_mutex);
  g_live->erase(this);
}

void early_offloads::wait_all_live() noexcept {
  std::lock_guard live(g_live_mutex);
  if (!g_live) return;
  for (early_offloads* e : *g_live) {
    std::unique_lock lock(e->mutex_);
    e->join_where(-1, lock);
  }
}

// Joins the jobs of `ordinal` (-1: all), keeping the first deferred failure. A job another
// thread is joining is waited for until it is gone.
void early_offloads::join_where(int ordinal, std::unique_lock<std::mutex>& lock) {
  for (;;) {
    auto it = jobs_.begin();
    while (it != jobs_.end() && ordinal >= 0 && it->ordinal != ordinal) ++it;
    if (it == jobs_.end()) return;
    if (it->joining) {
      changed_.wait(lock);
      continue;
    }
    it->joining = true;
    std::thread t = std::move(it->thread);
    lock.unlock();
    t.join();
    lock.lock();
    forget(it);
  }
}

void early_offloads::forget(std::list<job>::iterator it) {
  if (it->error && !deferred_) {
    deferred_ = it->error;
    deferred_ordinal_ = it->ordinal;
  }
  jobs_.erase(it);
  changed_.notify_all();
}

void early_offloads::start(int ordinal, body_type body) {
  std::unique_lock lock(mutex_);
  // Threads of finished offloads are joined here, so that they never pile up.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    auto next = std::next(it);
    if (it->finished && !it->joining) {
      it->thread.join();  // it has returned already
      forget(it);
    }
    it = next;
  }
  jobs_.emplace_back();
  job* j = &jobs_.back();
  j->ordinal = ordinal;
  try {
    j->thread = std::thread([this, j, body = std::move(body)] {
      std::exception_ptr error;
      try {
        body([this, j] {
          std::lock_guard l(mutex_);
          j->queued = true;
          changed_.notify_all();
        });
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard l(mutex_);
      if (error && j->queued && logging(log_level::info)) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          log_line(std::string("offload failed after returning early (TAGMEM_OFFLOAD_RETURN=queued;"
                               " tagmem_wait_released reports it): ") +
                   e.what());
        } catch (...) {
        }
      }
      j->error = error;
      j->finished = true;
      changed_.notify_all();
    });
  } catch (...) {
    jobs_.pop_back();
    fail(TAGMEM_ERROR_DRIVER,
         "cannot start a thread for an offload (TAGMEM_OFFLOAD_RETURN=queued)");
  }
  changed_.wait(lock, [j] { return j->queued || j->finished; });
  if (!j->queued && j->error) {  // failed before anything was queued: the caller's failure
    std::exception_ptr e = j->error;
    j->error = nullptr;
    std::rethrow_exception(e);
  }
}

void early_offloads::wait(int ordinal) {
  std::unique_lock lock(mutex_);
  join_where(ordinal, lock);
  if (deferred_ && (ordinal < 0 || deferred_ordinal_ == ordinal)) {
    std::exception_ptr e = deferred_;
    deferred_ = nullptr;
    deferred_ordinal_ = -1;
    lock.unlock();
    std::rethrow_exception(e);
  }
}

}  // namespace tagmem
