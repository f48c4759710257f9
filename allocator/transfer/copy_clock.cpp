// copy_clock.cpp — device-timed copy pieces of a phase switch (see copy_clock.hpp).
#include "transfer/copy_clock.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "driver/driver.hpp"

namespace tagmem::trace {

struct copy_piece {
  CUstream stream;
  CUevent end;
  double queued_us;
  bool to_host;
  const char* tag;
  std::size_t bytes;
};

struct copy_clock::impl {
  CUcontext context = nullptr;
  CUevent base = nullptr;
  double base_us = 0;
  std::vector<copy_piece> pieces;
};

namespace {
thread_local copy_clock::impl* t_clock = nullptr;

// Switches to `context` for the holder's lifetime (the clock's calls may run outside the
// pipeline's own context guard).
struct with_context {
  CUcontext previous = nullptr;
  bool switched = false;
  explicit with_context(CUcontext c) {
    const auto& api = driver::api();
    if (api.cuCtxGetCurrent(&previous) == CUDA_SUCCESS && previous != c)
      switched = api.cuCtxSetCurrent(c) == CUDA_SUCCESS;
  }
  ~with_context() {
    if (switched) driver::api().cuCtxSetCurrent(previous);
  }
};
}  // namespace

copy_clock::copy_clock(CUcontext context, CUstream stream) noexcept {
  if (!recording() || t_clock) return;
  try {
    auto* c = new impl;
    c->context = context;
    with_context guard(context);
    const auto& api = driver::api();
    if (api.cuEventCreate(&c->base, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      delete c;
      return;
    }
    // Note [trace clock]: the host time before the record, and no wait.
    c->base_us = now_us();
    if (api.cuEventRecord(c->base, stream) != CUDA_SUCCESS) {
      api.cuEventDestroy(c->base);
      delete c;
      return;
    }
    impl_ = c;
    t_clock = c;
  } catch (...) {
  }
}

copy_clock::~copy_clock() {
  if (!impl_) return;
  t_clock = nullptr;
  impl& c = *impl_;
  with_context guard(c.context);
  const auto& api = driver::api();
  std::map<CUstream, double> last_end;
  for (const copy_piece& p : c.pieces) {
    float ms = 0;
    const bool timed = api.cuEventSynchronize(p.end) == CUDA_SUCCESS &&
                       api.cuEventElapsedTime(&ms, c.base, p.end) == CUDA_SUCCESS;
    api.cuEventDestroy(p.end);
    if (!timed) continue;  // a failed copy: the switch's own span and log say so
    const double end = c.base_us + ms * 1e3;
    double& prev = last_end[p.stream];
    const double start = std::min(end, std::max(prev, p.queued_us));
    prev = end;
    copy_span(p.stream, p.to_host, start, end - start, p.tag, p.bytes);
  }
  api.cuEventDestroy(c.base);
  delete impl_;
}

void copy_queued(CUstream stream, bool to_host, const char* tag, std::size_t bytes) noexcept {
  if (!on() || !t_clock) return;
  try {
    const auto& api = driver::api();
    CUevent e = nullptr;
    if (api.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return;
    if (api.cuEventRecord(e, stream) != CUDA_SUCCESS) {
      api.cuEventDestroy(e);
      return;
    }
    try {
      t_clock->pieces.push_back({stream, e, now_us(), to_host, tag, bytes});
    } catch (...) {
      api.cuEventDestroy(e);
    }
  } catch (...) {
  }
}

}  // namespace tagmem::trace
