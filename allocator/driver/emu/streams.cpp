// streams.cpp — stream objects with worker threads; cuStreamCreate/Destroy/Query.
//
// A stream counts operations submitted and completed; waiting for a ticket (the submitted count
// at some moment) is waiting for `completed` to reach it, so a synchronize never waits for work
// queued after it began. The registry maps each CUstream (the stream's address) to a shared_ptr,
// so a handle is validated before it is used and a stream destroyed by one thread stays alive
// for another that is still waiting on it.
#include "streams.hpp"

#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <system_error>
#include <thread>
#include <vector>

#include "api.hpp"
#include "contexts.hpp"

namespace tagmem::emu {

struct stream {
  int device = 0;
  uint64_t generation = 0;
  unsigned flags = 0;

  std::mutex mutex;  // guards what follows; taken after the global lock, never before
  std::condition_variable changed;
  std::deque<operation> queue;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  bool stopping = false;
  std::thread worker;

  uint64_t push(operation op) {
    std::lock_guard guard(mutex);
    queue.push_back(std::move(op));
    const uint64_t ticket = ++submitted;
    changed.notify_all();
    return ticket;
  }

  uint64_t ticket() {
    std::lock_guard guard(mutex);
    return submitted;
  }

  void wait(uint64_t ticket) {
    std::unique_lock guard(mutex);
    changed.wait(guard, [&] { return completed >= ticket; });
  }

  bool idle() {
    std::lock_guard guard(mutex);
    return completed == submitted;
  }

  void run() {
    for (;;) {
      operation op;
      {
        std::unique_lock guard(mutex);
        changed.wait(guard, [&] { return !queue.empty() || stopping; });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
      }
      if (CUresult r = op(); r != CUDA_SUCCESS) raise_sticky_error(device, r);
      std::lock_guard guard(mutex);
      ++completed;
      changed.notify_all();
    }
  }

  // Lets queued work finish, then ends the worker.
  void stop() {
    {
      std::lock_guard guard(mutex);
      stopping = true;
      changed.notify_all();
    }
    if (worker.joinable()) worker.join();
  }
};

namespace {

std::map<stream*, std::shared_ptr<stream>>& registry() {
  static auto* instance = new std::map<stream*, std::shared_ptr<stream>>;  // leaked
  return *instance;
}

// A registered stream of `device`'s current context with its worker running; null when no thread
// can be started.
std::shared_ptr<stream> start_stream(lock& held, int device, unsigned flags) {
  auto s = std::make_shared<stream>();
  s->device = device;
  s->generation = context_generation(held, device);
  s->flags = flags;
  try {
    s->worker = std::thread([raw = s.get()] { raw->run(); });
  } catch (const std::system_error&) {
    return nullptr;
  }
  registry().emplace(s.get(), s);
  return s;
}

bool is_null_stream(CUstream handle) { return handle == nullptr || handle == CU_STREAM_LEGACY; }

// Note [emu streams]: this thread's per-thread default streams, one per device, made on first
// use. They are not counted as live streams (the program never created them) and end with the
// thread; one left behind by a torn-down context is retired, not reused. In a forked child their
// workers do not exist, so nothing is stopped there.
struct per_thread_streams {
  std::map<int, std::shared_ptr<stream>> current;
  std::vector<std::shared_ptr<stream>> retired;
  pid_t owner = getpid();
  ~per_thread_streams() {
    if (getpid() != owner) return;
    {
      lock held = take_lock();
      for (auto& [device, s] : current) registry().erase(s.get());
    }
    for (auto& [device, s] : current) s->stop();
    for (auto& s : retired) s->stop();
  }
};
thread_local per_thread_streams t_per_thread;

CUresult per_thread_stream(lock& held, std::shared_ptr<stream>* out) {
  int device = 0;
  if (CUresult r = current_device(held, &device); r != CUDA_SUCCESS) return r;
  const uint64_t generation = context_generation(held, device);
  std::shared_ptr<stream>& mine = t_per_thread.current[device];
  if (mine && mine->generation != generation) {
    registry().erase(mine.get());
    t_per_thread.retired.push_back(std::move(mine));
  }
  if (!mine) mine = start_stream(held, device, 0);
  if (!mine) return CUDA_ERROR_OUT_OF_MEMORY;
  *out = mine;
  return CUDA_SUCCESS;
}

// The streams of `device` matching `want`, with their current tickets.
template <class Predicate>
std::vector<std::pair<std::shared_ptr<stream>, uint64_t>> snapshot(Predicate want) {
  std::vector<std::pair<std::shared_ptr<stream>, uint64_t>> found;
  lock held = take_lock();
  for (auto& [key, s] : registry())
    if (want(*s)) found.emplace_back(s, s->ticket());
  return found;
}

void wait_for(const std::vector<std::pair<std::shared_ptr<stream>, uint64_t>>& streams) {
  for (auto& [s, ticket] : streams) s->wait(ticket);
}

// Note [emu streams]: the queue of the waits the legacy stream of `device` was told to make;
// made on first use and never destroyed. Null when no thread can be started for it.
std::shared_ptr<stream> legacy_waits(lock& held, int device, bool create) {
  static auto* all = new std::map<int, std::shared_ptr<stream>>;  // leaked, as the registry
  std::shared_ptr<stream>& s = (*all)[device];
  if (!s && create) s = start_stream(held, device, 0);
  return s;
}

void wait_blocking_streams(int device) {
  wait_for(snapshot(
      [&](stream& s) { return s.device == device && (s.flags & CU_STREAM_NON_BLOCKING) == 0; }));
}

}  // namespace

CUresult resolve_stream(lock& held, CUstream handle, target* out) {
  if (handle == CU_STREAM_PER_THREAD) {
    if (CUresult r = per_thread_stream(held, &out->queue); r != CUDA_SUCCESS) return r;
    out->device = out->queue->device;
    return CUDA_SUCCESS;
  }
  if (is_null_stream(handle)) {
    out->queue = nullptr;
    return current_device(held, &out->device);
  }
  auto it = registry().find(reinterpret_cast<stream*>(handle));
  if (it == registry().end()) return CUDA_ERROR_INVALID_HANDLE;
  out->queue = it->second;
  out->device = it->second->device;
  return check_context(held, out->device, it->second->generation);
}

void submit(const target& where, operation op) {
  if (where.queue) {
    if ((where.queue->flags & CU_STREAM_NON_BLOCKING) == 0) {  // ordered after the legacy stream
      std::shared_ptr<stream> waits;
      {
        lock held = take_lock();
        waits = legacy_waits(held, where.device, false);
      }
      if (waits && waits != where.queue && !waits->idle()) {
        op = [waits, ticket = waits->ticket(), op = std::move(op)] {
          waits->wait(ticket);
          return op();
        };
      }
    }
    where.queue->push(std::move(op));
    return;
  }
  wait_blocking_streams(where.device);
  if (CUresult r = op(); r != CUDA_SUCCESS) raise_sticky_error(where.device, r);
}

void submit_wait(const target& where, operation wait) {
  if (!where.queue) {
    std::shared_ptr<stream> waits;
    {
      lock held = take_lock();
      waits = legacy_waits(held, where.device, true);
    }
    if (waits) {
      waits->push(std::move(wait));
      return;
    }
  }
  submit(where, std::move(wait));
}

void wait_idle(const target& where) {
  if (where.queue)
    where.queue->wait(where.queue->ticket());
  else
    wait_blocking_streams(where.device);
}

bool idle(const target& where) {
  if (where.queue) return where.queue->idle();
  bool all = true;
  for (auto& [s, ticket] : snapshot([&](stream& s) {
         return s.device == where.device && (s.flags & CU_STREAM_NON_BLOCKING) == 0;
       }))
    all = all && s->idle();
  return all;
}

void wait_device_streams(int device) {
  wait_for(snapshot([&](stream& s) { return s.device == device; }));
}

void synchronize_all_devices() {
  wait_for(snapshot([](stream&) { return true; }));
}

void drain_device_streams(int device, uint64_t generation) {
  wait_for(snapshot([&](stream& s) { return s.device == device && s.generation == generation; }));
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuStreamCreate(CUstream* handle, unsigned int flags) {
  TAGMEM_EMU_ENTRY(cuStreamCreate);
  if (handle == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  int device = 0;
  if (CUresult r = current_device(held, &device); r != CUDA_SUCCESS) return r;
  std::shared_ptr<stream> s = start_stream(held, device, flags);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  ++live(held).streams;
  *handle = reinterpret_cast<CUstream>(s.get());
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuStreamDestroy(CUstream handle) {
  TAGMEM_EMU_ENTRY(cuStreamDestroy);
  if (is_null_stream(handle) || handle == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  lock held = take_lock();
  auto it = registry().find(reinterpret_cast<stream*>(handle));
  if (it == registry().end()) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<stream> s = std::move(it->second);
  registry().erase(it);
  --live(held).streams;
  // Destroyed either way; a dead or poisoned context still reports its error, as measured.
  const CUresult status = check_context(held, s->device, s->generation);
  held.unlock();
  s->stop();
  return status;
}

TAGMEM_EMU_EXPORT CUresult cuStreamQuery(CUstream handle) {
  TAGMEM_EMU_ENTRY(cuStreamQuery);
  target where;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, handle, &where); r != CUDA_SUCCESS) return r;
  }
  if (!idle(where)) return CUDA_ERROR_NOT_READY;
  return sticky_error(where.device);
}
