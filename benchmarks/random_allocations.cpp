// random_allocations.cpp — allocate/free throughput in the style of RMM's random_allocations:
// a random sequence of allocations (sizes uniform in [1, max]) and frees of random live ones,
// replayed each iteration, ending with everything freed. Allocators, in the same binary:
//  - cuda_async:      cuMemAllocAsync/cuMemFreeAsync on the device's default pool with the
//                     release threshold at UINT64_MAX (the pool keeps what it got);
//  - tagmem_mimalloc: tagmem_malloc/tagmem_free, metadata in mimalloc (the default);
//  - tagmem_system:   the same with TAGMEM_METADATA=system (metadata on malloc).
// tagmem is shut down and initialised again to switch the metadata allocator (Note [metadata
// heap]); everything runs on one created stream, synchronised at the end of each iteration.
// Live bytes are capped (TAGMEM_BENCH_LIVE_BYTES, default a quarter of the device, at most
// 16 GiB) so large maxima exercise reuse rather than exhaustion.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "bench_support.hpp"
#include "options/options.hpp"
#include "tagmem/tagmem.h"

using namespace tagmem::bench;

namespace {

enum class allocator_kind { cuda_async, tagmem_mimalloc, tagmem_system };

struct op {
  bool alloc;        // else free
  std::size_t size;  // bytes to allocate
  std::size_t slot;  // where the pointer lives between its allocation and its free
};

std::size_t live_cap() {
  using tagmem::option;
  if (tagmem::option_env(option::BENCH_LIVE_BYTES)) {
    return tagmem::option_number(option::BENCH_LIVE_BYTES);
  }
  std::size_t free_b = 0, total = 0;
  use_device0();
  BENCH_CU(cuMemGetInfo, &free_b, &total);
  return std::min<std::size_t>(total / 4, 16ull << 30);
}

// `count` allocations interleaved with frees; slots are reused after a free.
std::vector<op> make_sequence(std::size_t count, std::size_t max_size) {
  std::mt19937_64 rng(count * 31 + max_size);
  std::uniform_int_distribution<std::size_t> size(1, max_size);
  const std::size_t cap = live_cap();
  std::vector<op> ops;
  std::vector<std::size_t> live_sizes;  // by slot position in `live`
  std::vector<std::size_t> live;        // slot ids
  std::vector<std::size_t> free_slots;
  std::size_t slots = 0, live_bytes = 0, made = 0;
  while (made < count || !live.empty()) {
    bool do_alloc = made < count && (live.empty() || rng() % 2 == 0);
    std::size_t n = do_alloc ? size(rng) : 0;
    if (do_alloc && live_bytes + n > cap && !live.empty()) do_alloc = false;
    if (do_alloc) {
      std::size_t slot = free_slots.empty() ? slots++ : free_slots.back();
      if (!free_slots.empty()) free_slots.pop_back();
      ops.push_back({true, n, slot});
      live.push_back(slot);
      live_sizes.push_back(n);
      live_bytes += n;
      ++made;
    } else {
      std::size_t k = rng() % live.size();
      ops.push_back({false, 0, live[k]});
      free_slots.push_back(live[k]);
      live_bytes -= live_sizes[k];
      live[k] = live.back();
      live.pop_back();
      live_sizes[k] = live_sizes.back();
      live_sizes.pop_back();
    }
  }
  return ops;
}

allocator_kind g_current = allocator_kind::cuda_async;
bool g_initialised = false;
CUstream g_stream = nullptr;

void use(allocator_kind kind) {
  use_device0();
  if (!g_stream) BENCH_CU(cuStreamCreate, &g_stream, CU_STREAM_NON_BLOCKING);
  if (kind == allocator_kind::cuda_async) {
    CUmemoryPool pool = nullptr;
    BENCH_CU(cuDeviceGetDefaultMemPool, &pool, 0);
    cuuint64_t threshold = ~cuuint64_t(0);
    BENCH_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    return;
  }
  if (g_initialised && g_current == kind) return;
  if (g_initialised) tagmem_shutdown();
  setenv("TAGMEM_METADATA", kind == allocator_kind::tagmem_system ? "system" : "mimalloc", 1);
  if (tagmem_init(nullptr) != TAGMEM_SUCCESS) {
    throw std::runtime_error(std::string("tagmem_init: ") + tagmem_last_error());
  }
  g_initialised = true;
  g_current = kind;
}

void BM_random_allocations(benchmark::State& state, allocator_kind kind) {
  const std::size_t count = state.range(0);
  const std::size_t max_size = std::size_t(state.range(1)) << 10;
  std::vector<op> ops;
  try {
    use(kind);
    ops = make_sequence(count, max_size);
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
    return;
  }
  std::size_t slots = 0;
  for (const op& o : ops) slots = std::max(slots, o.slot + 1);
  std::vector<void*> slot_ptr(slots, nullptr);
  bool failed = false;
  for (auto _ : state) {
    for (std::size_t i = 0; i < ops.size() && !failed; ++i) {
      const op& o = ops[i];
      if (o.alloc) {
        void* p = nullptr;
        if (kind == allocator_kind::cuda_async) {
          CUdeviceptr d = 0;
          failed = cu().cuMemAllocAsync(&d, o.size, g_stream) != CUDA_SUCCESS;
          p = reinterpret_cast<void*>(d);
        } else {
          failed = tagmem_malloc_tagged(&p, o.size, "bench", 0, g_stream) != TAGMEM_SUCCESS;
        }
        slot_ptr[o.slot] = p;
      } else {
        void* p = slot_ptr[o.slot];
        if (kind == allocator_kind::cuda_async) {
          failed = cu().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(p), g_stream) != CUDA_SUCCESS;
        } else {
          failed = tagmem_free(p, g_stream) != TAGMEM_SUCCESS;
        }
      }
    }
    if (cu().cuStreamSynchronize(g_stream) != CUDA_SUCCESS) failed = true;
    if (failed) {
      state.SkipWithError(kind == allocator_kind::cuda_async ? "cuMemAllocAsync/FreeAsync failed"
                                                             : tagmem_last_error());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * count);
  if (kind != allocator_kind::cuda_async) tagmem_empty_cache(0);  // the next case starts cold
}

void sizes(benchmark::internal::Benchmark* b) {
  // allocations x max size in KiB
  b->ArgsProduct({{1000, 10000, 100000}, {1, 1024, 65536}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();  // the device and the driver work on other threads too
}

}  // namespace

BENCHMARK_CAPTURE(BM_random_allocations, cuda_async, allocator_kind::cuda_async)->Apply(sizes);
BENCHMARK_CAPTURE(BM_random_allocations, tagmem_mimalloc, allocator_kind::tagmem_mimalloc)
    ->Apply(sizes);
BENCHMARK_CAPTURE(BM_random_allocations, tagmem_system, allocator_kind::tagmem_system)
    ->Apply(sizes);

BENCHMARK_MAIN();
