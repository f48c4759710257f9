// tagmem_libtorch.cpp — the libtorch global-mode installer (see tagmem_libtorch.hpp).
//
// The allocator is PyTorch's pluggable allocator with three additions PyTorch's C++ side allows:
// a record-stream hook (stream_records.hpp, Note [recorded streams]), a reset hook that
// torch.cuda.empty_cache() reaches, and device statistics (torch.cuda.memory_stats() and the
// functions built on it) from counters kept here and tagmem's own reserved bytes. The allocation
// function calls tagmem's C ABI directly so failures raise the c10 exception types PyTorch's own
// allocator raises. The allocator object is kept for the process: PyTorch stores it in a global
// and frees through it until exit.
#include "tagmem_libtorch.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "stream_records.hpp"

namespace tagmem::libtorch {
namespace {

using pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

constexpr int kMaxDevices = 128;

// PyTorch-style counters of one device: current, peak, and the totals since the last reset.
struct counter {
  std::atomic<int64_t> current{0}, peak{0}, allocated{0}, freed{0};
  void add(int64_t n) {
    int64_t now = current.fetch_add(n) + n;
    allocated.fetch_add(n);
    for (int64_t p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
    }
  }
  void remove(int64_t n) {
    current.fetch_sub(n);
    freed.fetch_add(n);
  }
};

struct device_counters {
  counter allocations, bytes;
  std::atomic<int64_t> reserved_peak{0}, ooms{0};
};

device_counters g_counters[kMaxDevices];
std::mutex g_mutex;
std::atomic<bool> g_installed{false};

device_counters* counters_of(int device) {
  return device >= 0 && device < kMaxDevices ? &g_counters[device] : nullptr;
}

std::string failure(const char* what, tagmem_status status) {
  return std::string("tagmem: ") + what + ": " + tagmem_status_string(status) + ": " +
         tagmem_last_error();
}

void* allocate(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  void* p = nullptr;
  tagmem_status status = tagmem_malloc(&p, size, device, reinterpret_cast<tagmem_stream>(stream));
  if (status == TAGMEM_ERROR_OUT_OF_MEMORY) {
    if (auto* c = counters_of(device)) c->ooms.fetch_add(1);
    TORCH_CHECK_WITH(OutOfMemoryError, false, failure("allocation", status));
  }
  TORCH_CHECK(status == TAGMEM_SUCCESS, failure("allocation", status));
  if (auto* c = counters_of(device)) {
    c->allocations.add(1);
    c->bytes.add(static_cast<int64_t>(size));
  }
  return p;
}

void deallocate(void* p, size_t size, int device, cudaStream_t stream) {
  if (p == nullptr) return;
  auto status = static_cast<tagmem_status>(free_after_recorded_streams(p, device, stream));
  if (status != TAGMEM_SUCCESS) {  // a deleter must not throw
    std::fprintf(stderr, "%s\n", failure("free", status).c_str());
    return;
  }
  if (auto* c = counters_of(device)) {
    c->allocations.remove(1);
    c->bytes.remove(static_cast<int64_t>(size));
  }
}

// Whether tagmem has tags on `device` (asking sets up nothing on a device it never used).
bool has_tags(int device) {
  size_t tags = 0;
  return tagmem_list_tags(device, nullptr, 0, &tags) == TAGMEM_SUCCESS && tags > 0;
}

// torch.cuda.empty_cache(): every device where tagmem has tags.
void empty_caches() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  for (int d = 0; d < count; ++d) {
    if (has_tags(d)) tagmem_empty_cache(d);
  }
}

template <class Stat>
void fill(Stat& s, const counter& c) {
  s.current = c.current.load();
  s.peak = c.peak.load();
  s.allocated = c.allocated.load();
  s.freed = c.freed.load();
}

// The pluggable allocator with device statistics. PyTorch's type for them moved between
// releases; it is taken from the base class's declaration.
class allocator final : public pluggable {
 public:
  using pluggable::pluggable;
  using device_stats = decltype(std::declval<pluggable&>().getDeviceStats(c10::DeviceIndex{}));

  device_stats getDeviceStats(c10::DeviceIndex device) override {
    device_stats out{};
    device_counters* c = counters_of(device);
    if (c == nullptr) return out;
    // Index 0 of each statistic array is the aggregate over small and large pools.
    fill(out.allocation[0], c->allocations);
    fill(out.active[0], c->allocations);
    fill(out.allocated_bytes[0], c->bytes);
    fill(out.active_bytes[0], c->bytes);
    fill(out.requested_bytes[0], c->bytes);
    tagmem_device_stats ds{};
    if (has_tags(device) && tagmem_device_stats_get(device, &ds) == TAGMEM_SUCCESS) {
      const auto reserved = static_cast<int64_t>(ds.reserved_bytes);
      for (int64_t p = c->reserved_peak.load();
           reserved > p && !c->reserved_peak.compare_exchange_weak(p, reserved);) {
      }
      out.reserved_bytes[0].current = reserved;
      out.reserved_bytes[0].peak = c->reserved_peak.load();
    }
    out.num_ooms = c->ooms.load();
    return out;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    device_counters* c = counters_of(device);
    if (c == nullptr) return;
    c->allocations.peak.store(c->allocations.current.load());
    c->bytes.peak.store(c->bytes.current.load());
    tagmem_device_stats ds{};
    int64_t reserved = 0;
    if (has_tags(device) && tagmem_device_stats_get(device, &ds) == TAGMEM_SUCCESS) {
      reserved = static_cast<int64_t>(ds.reserved_bytes);
    }
    c->reserved_peak.store(reserved);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    device_counters* c = counters_of(device);
    if (c == nullptr) return;
    for (counter* k : {&c->allocations, &c->bytes}) {
      k->allocated.store(0);
      k->freed.store(0);
    }
    c->ooms.store(0);
  }
};

}  // namespace

void install(bool track_record_streams) {
  std::lock_guard lock(g_mutex);
  if (g_installed.load()) return;
  auto* current = c10::cuda::CUDACachingAllocator::get();
  if (current != nullptr && current->initialized()) {
    throw api_error(TAGMEM_ERROR_INVALID_ARGUMENT,
                    "TAGMEM_ERROR_INVALID_ARGUMENT: tagmem::libtorch::install() must run before "
                    "CUDA initialises in PyTorch (before the first CUDA tensor); PyTorch's "
                    "allocator is already in use");
  }
  auto a = std::make_shared<allocator>(allocate, deallocate);
  if (track_record_streams) a->set_record_stream_fn(record_stream);
  a->set_reset_fn(empty_caches);
  a->init(0);  // as createCustomAllocator does
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
  g_installed.store(true);
}

bool installed() noexcept { return g_installed.load(); }

}  // namespace tagmem::libtorch

extern "C" int tagmem_libtorch_install(int track_record_streams, char* message, size_t length) {
  auto report = [&](const char* text) {
    if (message != nullptr && length > 0) {
      std::strncpy(message, text, length - 1);
      message[length - 1] = '\0';
    }
  };
  try {
    tagmem::libtorch::install(track_record_streams != 0);
    return TAGMEM_SUCCESS;
  } catch (const tagmem::api_error& e) {
    report(e.what());
    return e.code();
  } catch (const std::exception& e) {
    report(e.what());
    return TAGMEM_ERROR_INTERNAL;
  }
}

extern "C" size_t tagmem_libtorch_joined_frees(void) { return tagmem::libtorch::joined_frees(); }
