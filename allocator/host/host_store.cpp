// host_store.cpp — pinned slabs, extents and background pinning (see Note [pin once]).
//
// Free space is a map of ranges coalesced within a slab; an acquire takes ranges in address
// order until it has its bytes, so its extents may come from several slabs (the copy pipeline
// cuts copies at extent boundaries) and any free byte serves any request: there is no
// fragmentation that would force pinning more in steady state.
#include "host/host_store.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "base/byte_math.hpp"
#include "base/error.hpp"
#include "driver/driver.hpp"
#include "host/host_budget.hpp"

namespace tagmem {
namespace {

constexpr std::size_t kPage = 2u << 20;

}  // namespace

host_store::host_store(std::size_t slab_bytes, CUcontext context, std::size_t max_bytes)
    : slab_bytes_(round_up(slab_bytes, kPage)),
      max_bytes_(max_bytes),
      context_(context),
      method_(pin_method_from_env()),
      threads_(pin_threads_from_env()) {}

host_store::~host_store() {
  std::unique_lock lock(mutex_);
  stop_background(lock);
  // A slab whose unpin fails stays pinned and mapped for the life of the process: a destructor
  // cannot report it, and unmapping it could pull pages from under the driver (Note [unpin keeps
  // what it cannot release] in host_pinning.hpp). The others are unpinned all the same.
  meta_vector<pinned_slab> all;
  try {
    all.reserve(slabs_.size());
    for (auto& [base, s] : slabs_) all.push_back({base, s.size});
  } catch (...) {  // no memory for the list: unpin one by one
    for (auto& [base, s] : slabs_) (void)unpin_slab({base, s.size}, method_, context_);
    return;
  }
  unpin_parallel(all.data(), all.size(), threads_, method_, context_);
}

void host_store::stop_background(std::unique_lock<std::mutex>& lock) {
  target_bytes_ = 0;
  changed_.wait(lock, [&] { return !background_running_; });
  if (background_.joinable()) background_.join();  // it has left its last critical section
}

std::size_t host_store::free_bytes_locked() const {
  return stats_.pinned_bytes - stats_.used_bytes - free_returned_locked();
}

std::size_t host_store::free_returned_locked() const {
  std::size_t n = 0;
  for (const auto& [base, s] : slabs_) n += s.returned ? s.size - s.used : 0;
  return n;
}

void host_store::add_slab(pinned_slab r, std::size_t& added, bool returned) {
  std::lock_guard lock(mutex_);
  slabs_.emplace(r.base, slab{r.size, 0, returned});
  try {
    free_.emplace(r.base, r.size);
  } catch (...) {
    slabs_.erase(r.base);
    throw;  // pin_parallel unpins it
  }
  stats_.pinned_bytes += r.size;
  stats_.high_water = std::max(stats_.high_water, stats_.pinned_bytes);
  growing_ -= r.size;  // now counted as pinned
  added += r.size;
  changed_.notify_all();
}

std::size_t host_store::budget_locked(std::size_t headroom, std::size_t pinned) const {
  std::size_t budget = pinned + std::min(headroom, SIZE_MAX - pinned);
  return max_bytes_ ? std::min(budget, max_bytes_) : budget;
}

void host_store::set_memory_source(memory_source source, void* context) noexcept {
  std::lock_guard lock(mutex_);
  memory_source_ = source;
  memory_context_ = context;
}

host_store::memory_reading host_store::read_memory() {
  memory_reading r;
  memory_source source = nullptr;
  void* context = nullptr;
  {
    std::lock_guard lock(mutex_);
    r.pinned_before = stats_.pinned_bytes;
    source = memory_source_;
    context = memory_context_;
  }
  r.memory = source ? source(context) : read_host_memory();  // file reads: outside the lock
  return r;
}

// Note [host budget]: the room is taken from the budget under the lock, before any page is
// touched, so that growths on several threads cannot together pass it. The figures are read
// outside the lock (file reads), so a slab pinned by another growth meanwhile may be missing
// from what they say is available while already counted as pinned: such a slab would count
// twice. The budget counts as pinned only what was pinned both before the read and now.
std::size_t host_store::claim(std::size_t need, std::size_t asked, const char* what,
                              bool returned) {
  const memory_reading r = read_memory();
  const host_memory& m = r.memory;
  std::lock_guard lock(mutex_);
  const std::size_t held = stats_.pinned_bytes + growing_;
  const std::size_t budget =
      budget_locked(host_headroom(m), std::min(r.pinned_before, stats_.pinned_bytes));
  const std::size_t room = (budget - std::min(budget, held)) / kPage * kPage;
  if (need > room) {
    std::string why =
        max_bytes_ && budget == max_bytes_
            ? "TAGMEM_HOST_MAX_BYTES=" + std::to_string(max_bytes_)
            : "TAGMEM_HOST_MAX_BYTES " +
                  (max_bytes_ ? "(" + std::to_string(max_bytes_) + ") is more than the default: "
                              : std::string("is unset; the default: ")) +
                  "what is pinned plus min(MemAvailable, free in each memory cgroup), less a "
                  "margin of " +
                  std::to_string(host_margin(m.total)) + " bytes; " + m.limited_by + " has " +
                  std::to_string(m.available) + " bytes available";
    fail(TAGMEM_ERROR_HOST_OUT_OF_MEMORY,
         std::string(what) + " asks for " + std::to_string(asked) +
             " bytes of pinned host memory: the pinned host store would have to grow by " +
             std::to_string(need) + " bytes, but its host budget is " + std::to_string(budget) +
             " bytes and it holds " + std::to_string(held) + " (" + why +
             "); nothing was pinned or changed");
  }
  const std::size_t n =
      returned ? need : std::min(round_up(std::max(need, slab_bytes_), kPage), room);
  growing_ += n;
  return n;
}

void host_store::grow(std::size_t need, std::size_t asked, const char* what, bool returned) {
  const std::size_t bytes = claim(
      round_up_checked(need, kPage, TAGMEM_ERROR_HOST_OUT_OF_MEMORY, what), asked, what, returned);
  std::size_t added = 0;  // guarded by mutex_
  struct unclaim {
    host_store& store;
    std::size_t bytes;
    std::size_t& added;
    ~unclaim() {
      std::lock_guard lock(store.mutex_);
      store.growing_ -= bytes - added;  // slabs that failed
    }
  } give_back{*this, bytes, added};
  pin_parallel(bytes, slab_bytes_, threads_, method_, context_,
               [this, &added, returned](pinned_slab r) { add_slab(r, added, returned); });
}

meta_vector<host_extent> host_store::acquire(std::size_t bytes) { return acquire(bytes, {}); }

meta_vector<host_extent> host_store::acquire(std::size_t bytes,
                                             const meta_vector<host_extent>& replacing) {
  std::size_t given = 0;
  for (const host_extent& e : replacing) given += e.size;
  std::unique_lock lock(mutex_);
  while (free_bytes_locked() + given < bytes) {
    if (background_running_ && stats_.pinned_bytes < target_bytes_) {
      changed_.wait(lock);  // a reserve() is pinning; its slabs may be enough
      continue;
    }
    std::size_t need = bytes - given - free_bytes_locked();
    lock.unlock();
    grow(need, bytes, "a backup");  // throws with nothing taken
    lock.lock();
  }
  meta_vector<host_extent> out;
  // Freeing only merges ranges: this many extents are enough, and reserving them is the last
  // step that may throw, before anything changed.
  out.reserve(free_.size() + replacing.size());
  std::size_t left = bytes;
  for (const host_extent& e : replacing) {
    const std::size_t take = std::min(left, e.size);
    if (take) out.push_back({e.ptr, take});  // stays used, where it was
    if (take < e.size) {
      give_back_locked(e.ptr + take, e.size - take);
      stats_.used_bytes -= e.size - take;
    }
    left -= take;
  }
  take_locked(left, false, out);
  return out;
}

meta_vector<host_extent> host_store::acquire_returned(std::size_t bytes) {
  std::unique_lock lock(mutex_);
  while (free_returned_locked() < bytes) {  // background pinning makes other slabs: no wait
    const std::size_t need = bytes - free_returned_locked();
    lock.unlock();
    grow(need, bytes, "a backup given back after its reload", true);  // throws: nothing taken
    lock.lock();
  }
  meta_vector<host_extent> out;
  out.reserve(free_.size());  // the last step that may throw, before anything changed
  take_locked(bytes, true, out);
  return out;
}

void host_store::take_locked(std::size_t bytes, bool returned, meta_vector<host_extent>& out) {
  stats_.used_bytes += bytes;
  std::size_t left = bytes;
  for (auto it = free_.begin(); left && it != free_.end();) {
    auto slab_it = std::prev(slabs_.upper_bound(it->first));
    if (slab_it->second.returned != returned) {
      ++it;
      continue;
    }
    std::size_t take = std::min(left, it->second);
    out.push_back({it->first, take});
    slab_it->second.used += take;
    char* start = it->first;
    std::size_t rest = it->second - take;
    it = free_.erase(it);
    if (rest) it = free_.emplace_hint(it, start + take, rest);
    left -= take;
  }
}

bool host_store::give_back_locked(char* ptr, std::size_t size) {
  auto slab_it = std::prev(slabs_.upper_bound(ptr));
  const bool returned = slab_it->second.returned;
  slab_it->second.used -= size;
  char* slab_start = slab_it->first;
  char* slab_end = slab_start + slab_it->second.size;
  auto next = free_.lower_bound(ptr);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == ptr && prev->first >= slab_start) {
      ptr = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && ptr + size == next->first && next->first < slab_end) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(ptr, size);
  return returned;
}

bool host_store::give_back(const meta_vector<host_extent>& extents) noexcept {
  std::lock_guard lock(mutex_);
  bool returned = false;
  for (const host_extent& e : extents) {
    returned |= give_back_locked(e.ptr, e.size);
    stats_.used_bytes -= e.size;
  }
  return returned;
}

void host_store::release(const meta_vector<host_extent>& extents) noexcept {
  // Note [backups given back to the system]: slabs of that class go back once empty, whatever the
  // tag that used them asks now (its flag may have changed since its offload).
  if (give_back(extents)) unpin_emptied(extents, true);
}

void host_store::unpin_emptied(const meta_vector<host_extent>& extents,
                               bool returned_only) noexcept {
  try {
    unpin_free_slabs([](std::unique_lock<std::mutex>&) {},
                     [&](char* base, std::size_t size) {  // under the lock
                       if (returned_only && !slabs_.at(base).returned) return false;
                       for (const host_extent& e : extents) {
                         if (e.ptr >= base && e.ptr < base + size) return true;
                       }
                       return false;
                     });
  } catch (...) {  // no memory for the lists, or an unpin failed: those slabs stay pinned, free
  }
}

void host_store::background_loop() {
  for (;;) {
    std::size_t need = 0;
    {
      std::lock_guard lock(mutex_);
      if (stats_.pinned_bytes >= target_bytes_) break;
      need = target_bytes_ - stats_.pinned_bytes;
    }
    try {
      grow(need, need, "tagmem_host_reserve");
    } catch (...) {
      break;  // dropped: the next acquire pins for itself and reports its own failure
    }
  }
  std::lock_guard lock(mutex_);
  background_running_ = false;
  changed_.notify_all();
}

void host_store::reserve(std::size_t bytes, growth how) {
  // Refused here, not in the background: a target that can never be pinned would keep the
  // background thread and every acquire waiting for it.
  (void)round_up_checked(bytes, kPage, TAGMEM_ERROR_INVALID_ARGUMENT, "tagmem_host_reserve");
  std::unique_lock lock(mutex_);
  if (how == growth::now) {
    changed_.wait(lock, [&] { return !background_running_; });
    if (stats_.pinned_bytes >= bytes) return;
    std::size_t need = bytes - stats_.pinned_bytes;
    lock.unlock();
    grow(need, bytes, "tagmem_host_reserve");
    return;
  }
  target_bytes_ = std::max(target_bytes_, bytes);
  if (background_running_ || stats_.pinned_bytes >= target_bytes_) return;
  if (background_.joinable()) background_.join();  // finished: it cleared background_running_
  background_running_ = true;
  try {
    background_ = std::thread([this] { background_loop(); });
  } catch (...) {
    background_running_ = false;
    throw;
  }
}

// Note [trim keeps what it cannot unpin]: the slabs to unpin leave the books under the lock, so
// that no acquire takes from them while they are unpinned without it (on several threads). Their
// map nodes are extracted, not erased: a slab whose unpin fails (it stays pinned and mapped, Note
// [unpin keeps what it cannot release]) goes back as the free slab it was, counted as pinned,
// without allocating, and trim then reports the failed call. Slabs unpinned fine stay unpinned.
template <class Prepare, class Pick>
void host_store::unpin_free_slabs(Prepare prepare, Pick doomed_slab) {
  struct taken_slab {
    decltype(slabs_)::node_type slab;
    decltype(free_)::node_type free;
  };
  meta_vector<taken_slab> taken;
  meta_vector<pinned_slab> doomed;
  meta_vector<unpin_result> results;
  {
    std::unique_lock lock(mutex_);
    prepare(lock);
    taken.reserve(slabs_.size());  // these may throw, before anything changed
    doomed.reserve(slabs_.size());
    results.resize(slabs_.size());
    for (auto it = slabs_.begin(); it != slabs_.end();) {
      if (it->second.used || !doomed_slab(it->first, it->second.size)) {
        ++it;  // holds a backup, or not picked
        continue;
      }
      doomed.push_back({it->first, it->second.size});
      stats_.pinned_bytes -= it->second.size;
      auto next = std::next(it);
      auto free_node = free_.extract(it->first);  // an unused slab is one free range
      taken.push_back({slabs_.extract(it), std::move(free_node)});
      it = next;
    }
  }
  const std::size_t failed =
      unpin_parallel(doomed.data(), doomed.size(), threads_, method_, context_, results.data());
  if (failed == 0) return;
  const unpin_result* first = nullptr;
  std::size_t kept = 0;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < doomed.size(); ++i) {
      if (results[i].ok()) continue;
      slabs_.insert(std::move(taken[i].slab));
      free_.insert(std::move(taken[i].free));
      stats_.pinned_bytes += doomed[i].size;
      kept += doomed[i].size;
      if (!first) first = &results[i];
    }
    // Another thread may have pinned more while these were out of the books.
    stats_.high_water = std::max(stats_.high_water, stats_.pinned_bytes);
    changed_.notify_all();
  }
  fail(TAGMEM_ERROR_DRIVER,
       std::string(first->call) +
           " failed while trimming the pinned host store: " + driver::describe(first->result) +
           "; " + std::to_string(failed) + " of " + std::to_string(doomed.size()) + " slabs (" +
           std::to_string(kept) + " bytes) stay pinned and usable");
}

void host_store::trim(std::size_t keep_bytes) {
  unpin_free_slabs(
      [&](std::unique_lock<std::mutex>& lock) {
        target_bytes_ = std::min(target_bytes_, keep_bytes);
        changed_.wait(lock, [&] { return !background_running_; });
      },
      // Slab by slab, under the lock, with pinned_bytes already lowered by those picked.
      [&](char*, std::size_t size) {
        return stats_.pinned_bytes > keep_bytes && stats_.pinned_bytes - size >= keep_bytes;
      });
}

void host_store::release_and_unpin(const meta_vector<host_extent>& extents) noexcept {
  give_back(extents);
  unpin_emptied(extents, false);
}

host_store_stats host_store::stats() {
  const memory_reading r = read_memory();
  std::lock_guard lock(mutex_);
  host_store_stats s = stats_;
  s.budget_bytes =
      budget_locked(host_headroom(r.memory), std::min(r.pinned_before, stats_.pinned_bytes));
  return s;
}

}  // namespace tagmem
