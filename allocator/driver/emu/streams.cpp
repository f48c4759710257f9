// streams.cpp — stream objects with worker threads; cuStreamCreate/Destroy/Synchronize/Query.
//
// A stream counts operations submitted and completed; waiting for a ticket (the submitted count
// at some moment) is waiting for `completed` to reach it, so a synchronize never waits for work
// queued after it began. The registry maps each CUstream (the stream's address) to a shared_ptr,
// so a handle is validated before it is used and a stream destroyed by one thread stays alive
// for another that is still waiting on it.
#include "streams.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <system_error>
#include <thread>
#include <vector>

#include "api.hpp"
#include "classic.hpp"
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

bool is_null_stream(CUstream handle) {
  return handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
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

void wait_blocking_streams(int device) {
  wait_for(snapshot(
      [&](stream& s) { return s.device == device && (s.flags & CU_STREAM_NON_BLOCKING) == 0; }));
}

}  // namespace

CUresult resolve_stream(lock& held, CUstream handle, target* out) {
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
    where.queue->push(std::move(op));
    return;
  }
  wait_blocking_streams(where.device);
  if (CUresult r = op(); r != CUDA_SUCCESS) raise_sticky_error(where.device, r);
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

CUresult synchronize_device(int device) {
  wait_for(snapshot([&](stream& s) { return s.device == device; }));
  lock held = take_lock();
  trim_pool(held, device);
  return sticky_error(device);
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
  auto s = std::make_shared<stream>();
  if (CUresult r = current_device(held, &s->device); r != CUDA_SUCCESS) return r;
  s->generation = context_generation(held, s->device);
  s->flags = flags;
  try {
    s->worker = std::thread([raw = s.get()] { raw->run(); });
  } catch (const std::system_error&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  registry().emplace(s.get(), s);
  ++live(held).streams;
  *handle = reinterpret_cast<CUstream>(s.get());
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuStreamDestroy(CUstream handle) {
  TAGMEM_EMU_ENTRY(cuStreamDestroy);
  if (is_null_stream(handle)) return CUDA_ERROR_INVALID_HANDLE;
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

TAGMEM_EMU_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  TAGMEM_EMU_ENTRY(cuStreamSynchronize);
  target where;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, handle, &where); r != CUDA_SUCCESS) return r;
  }
  wait_idle(where);
  lock held = take_lock();
  trim_pool(held, where.device);
  return sticky_error(where.device);
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
