// events.cpp — events: cuEventCreate/Destroy/Record/Synchronize/Query/ElapsedTime and
// cuStreamWaitEvent.
//
// Each cuEventRecord makes a fresh marker, an operation queued on the stream that stamps the
// time and signals when the stream reaches it; the event points at its latest marker. Query,
// synchronize and elapsed time look at the marker current when they are called, and
// cuStreamWaitEvent queues a wait for the marker current when it is called — the real driver's
// semantics for re-recorded events. Markers are shared, so destroying an event whose marker is
// still queued is harmless. An event never recorded counts as complete, as on the real driver.
#include <atomic>
#include <chrono>
#include <map>
#include <memory>

#include "api.hpp"
#include "classic.hpp"
#include "contexts.hpp"
#include "streams.hpp"

namespace tagmem::emu {
namespace {

struct marker {
  std::atomic<int> done{0};
  int64_t nanoseconds = 0;  // steady clock when the stream reached it; written before `done`

  void complete() {
    nanoseconds = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
    done.store(1, std::memory_order_release);
    done.notify_all();
  }
  bool reached() const { return done.load(std::memory_order_acquire) != 0; }
  void wait() const {
    while (!reached()) done.wait(0, std::memory_order_acquire);
  }
};

struct event {
  int device = 0;
  uint64_t generation = 0;
  unsigned flags = 0;
  std::shared_ptr<marker> last;  // the latest record, null before the first
};

std::map<event*, std::unique_ptr<event>>& registry() {
  static auto* instance = new std::map<event*, std::unique_ptr<event>>;  // leaked
  return *instance;
}

// The live event behind `handle` and the usability of its context.
CUresult find_event(lock& held, CUevent handle, event** out) {
  auto it = registry().find(reinterpret_cast<event*>(handle));
  if (it == registry().end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second.get();
  return check_context(held, (*out)->device, (*out)->generation);
}

operation wait_for(std::shared_ptr<marker> m) {
  return [m] {
    m->wait();
    return CUDA_SUCCESS;
  };
}

}  // namespace
}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuEventCreate(CUevent* handle, unsigned int flags) {
  TAGMEM_EMU_ENTRY(cuEventCreate);
  constexpr unsigned known =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (handle == nullptr || (flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  auto e = std::make_unique<event>();
  if (CUresult r = current_device(held, &e->device); r != CUDA_SUCCESS) return r;
  e->generation = context_generation(held, e->device);
  e->flags = flags;
  *handle = reinterpret_cast<CUevent>(e.get());
  registry().emplace(e.get(), std::move(e));
  ++live(held).events;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuEventDestroy(CUevent handle) {
  TAGMEM_EMU_ENTRY(cuEventDestroy);
  lock held = take_lock();
  auto it = registry().find(reinterpret_cast<event*>(handle));
  if (it == registry().end()) return CUDA_ERROR_INVALID_HANDLE;
  registry().erase(it);
  --live(held).events;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuEventRecord(CUevent handle, CUstream stream_handle) {
  TAGMEM_EMU_ENTRY(cuEventRecord);
  target where;
  auto m = std::make_shared<marker>();
  {
    lock held = take_lock();
    event* e = nullptr;
    if (CUresult r = find_event(held, handle, &e); r != CUDA_SUCCESS) return r;
    if (CUresult r = resolve_stream(held, stream_handle, &where); r != CUDA_SUCCESS) return r;
    e->last = m;
  }
  submit(where, [m] {
    m->complete();
    return CUDA_SUCCESS;
  });
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuStreamWaitEvent(CUstream stream_handle, CUevent handle,
                                             unsigned int flags) {
  TAGMEM_EMU_ENTRY(cuStreamWaitEvent);
  if (flags != CU_EVENT_WAIT_DEFAULT && flags != CU_EVENT_WAIT_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  target where;
  std::shared_ptr<marker> m;
  {
    lock held = take_lock();
    event* e = nullptr;
    if (CUresult r = find_event(held, handle, &e); r != CUDA_SUCCESS) return r;
    if (CUresult r = resolve_stream(held, stream_handle, &where); r != CUDA_SUCCESS) return r;
    m = e->last;
  }
  if (m) submit_wait(where, wait_for(std::move(m)));
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuEventQuery(CUevent handle) {
  TAGMEM_EMU_ENTRY(cuEventQuery);
  lock held = take_lock();
  event* e = nullptr;
  if (CUresult r = find_event(held, handle, &e); r != CUDA_SUCCESS) return r;
  return e->last && !e->last->reached() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuEventSynchronize(CUevent handle) {
  TAGMEM_EMU_ENTRY(cuEventSynchronize);
  std::shared_ptr<marker> m;
  int device = 0;
  {
    lock held = take_lock();
    event* e = nullptr;
    if (CUresult r = find_event(held, handle, &e); r != CUDA_SUCCESS) return r;
    m = e->last;
    device = e->device;
  }
  if (m) m->wait();
  return finish_synchronize(device);
}

TAGMEM_EMU_EXPORT CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end) {
  TAGMEM_EMU_ENTRY(cuEventElapsedTime);
  // The real driver answers INVALID_HANDLE for a null output too (measured).
  if (milliseconds == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  lock held = take_lock();
  event* a = nullptr;
  event* b = nullptr;
  if (CUresult r = find_event(held, start, &a); r != CUDA_SUCCESS) return r;
  if (CUresult r = find_event(held, end, &b); r != CUDA_SUCCESS) return r;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->last || !b->last) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->last->reached() || !b->last->reached()) return CUDA_ERROR_NOT_READY;
  *milliseconds = static_cast<float>(b->last->nanoseconds - a->last->nanoseconds) / 1e6f;
  return CUDA_SUCCESS;
}
