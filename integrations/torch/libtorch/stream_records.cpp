// stream_records.cpp — frees ordered after recorded streams (see stream_records.hpp, Note
// [recorded streams]).
#include "stream_records.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tagmem/tagmem.h"

namespace tagmem::libtorch {
namespace {

constexpr int kMaxDevices = 128;

std::mutex g_mutex;
std::unordered_map<void*, std::vector<cudaStream_t>>* g_recorded = nullptr;  // guarded, leaked:
// frees may run during static destruction
cudaStream_t g_join[kMaxDevices] = {};  // guarded by g_mutex, created on first use
std::atomic<std::size_t> g_joined{0};

// The device's join stream; nullptr if it cannot be created.
cudaStream_t join_stream(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (g_join[device] == nullptr) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    g_join[device] = s;
  }
  return g_join[device];
}

// Makes `join` wait for the work queued on `s` now.
bool join_after(cudaStream_t join, cudaStream_t s) {
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return false;
  bool ok = cudaEventRecord(e, s) == cudaSuccess && cudaStreamWaitEvent(join, e, 0) == cudaSuccess;
  cudaEventDestroy(e);  // released by the driver once the wait no longer needs it
  return ok;
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

void record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  std::lock_guard lock(g_mutex);
  if (g_recorded == nullptr) g_recorded = new std::unordered_map<void*, std::vector<cudaStream_t>>;
  auto& streams = (*g_recorded)[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
  }
}

int free_after_recorded_streams(void* ptr, int device, cudaStream_t stream) {
  std::vector<cudaStream_t> recorded;
  cudaStream_t join = nullptr;
  {
    std::lock_guard lock(g_mutex);
    if (g_recorded != nullptr) {
      auto it = g_recorded->find(ptr);
      if (it != g_recorded->end()) {
        recorded = std::move(it->second);
        g_recorded->erase(it);
      }
    }
    recorded.erase(std::remove(recorded.begin(), recorded.end(), stream), recorded.end());
    // Joining a stream under graph capture would pull the join stream into the capture; global
    // mode does not support capture anyway, so such a free stays ordered on `stream` alone.
    if (recorded.empty() || capturing(stream) ||
        std::any_of(recorded.begin(), recorded.end(), capturing)) {
      return tagmem_free(ptr, reinterpret_cast<tagmem_stream>(stream));
    }
    int current = -1;
    cudaGetDevice(&current);
    if (current != device) cudaSetDevice(device);
    join = join_stream(device);
    bool joined = join != nullptr && join_after(join, stream);
    for (cudaStream_t s : recorded) joined = joined && join_after(join, s);
    if (!joined) {  // ordering still holds, at the price of a host wait
      (void)cudaGetLastError();
      cudaStreamSynchronize(stream);
      for (cudaStream_t s : recorded) cudaStreamSynchronize(s);
      join = stream;
    }
    if (current != device && current >= 0) cudaSetDevice(current);
  }
  g_joined.fetch_add(1, std::memory_order_relaxed);
  return tagmem_free(ptr, reinterpret_cast<tagmem_stream>(join));
}

std::size_t joined_frees() { return g_joined.load(std::memory_order_relaxed); }

}  // namespace tagmem::libtorch
