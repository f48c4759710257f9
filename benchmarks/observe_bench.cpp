// observe_bench.cpp — what TAGMEM_TRACE and TAGMEM_LOG cost (Google Benchmark).
//
//  - span/off, span/on: one trace span (the unit every hook adds), tracing off and writing to a
//    file; off is the one branch of the hooks.
//  - switch/<mode>: offload then reload of a tag of --bytes (default 256 MiB in 2 MiB
//    allocations, the pieces of TAGMEM_COPY_PIECE_BYTES), mode 0: nothing on, 1: TAGMEM_TRACE,
//    2: TAGMEM_LOG=info (lines to /dev/null), 3: both. The difference to mode 0 is the cost of
//    observing a phase switch; on the emulated driver copies are host memcpy, so it is the cost
//    relative to a slower switch than a GPU's.
// tagmem is shut down and initialised again between modes, since both settings are read at init.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "observe/trace.hpp"
#include "tagmem/tagmem.h"

using namespace tagmem::bench;

namespace {

void restart(bool trace, bool log) {
  tagmem_shutdown();
  static const std::string path = "/tmp/tagmem_observe_bench_" + std::to_string(getpid()) + ".json";
  if (trace) {
    setenv("TAGMEM_TRACE", path.c_str(), 1);
  } else {
    unsetenv("TAGMEM_TRACE");
  }
  if (log) {
    setenv("TAGMEM_LOG", "info", 1);
  } else {
    unsetenv("TAGMEM_LOG");
  }
  if (tagmem_init(nullptr) != TAGMEM_SUCCESS) {
    std::fprintf(stderr, "tagmem_init: %s\n", tagmem_last_error());
    std::exit(1);
  }
}

void span(benchmark::State& state) {
  restart(state.range(0) != 0, false);
  for (auto _ : state) {
    tagmem::trace::span s("bench", "tag", 4096);
    benchmark::DoNotOptimize(&s);
  }
  restart(false, false);
}
// Fixed iterations: with tracing on every span is kept until the trace is written.
BENCHMARK(span)->Arg(0)->Arg(1)->Iterations(200000);

void phase_switch(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  restart(mode & 1, mode & 2);
  const std::size_t total = std::size_t(256) << 20;
  std::vector<void*> ptrs;
  for (std::size_t done = 0; done < total; done += 2u << 20) {
    void* p = nullptr;
    if (tagmem_malloc_tagged(&p, 2u << 20, "bench", 0, nullptr) != TAGMEM_SUCCESS) {
      state.SkipWithError(tagmem_last_error());
      return;
    }
    ptrs.push_back(p);
  }
  const char* tags[] = {"bench"};
  // The log goes to stderr: away from the terminal while measuring.
  const int saved = dup(STDERR_FILENO);
  const int null = open("/dev/null", O_WRONLY);
  dup2(null, STDERR_FILENO);
  for (auto _ : state) {
    if (tagmem_offload(tags, 1, 0, TAGMEM_BACKUP) != TAGMEM_SUCCESS ||
        tagmem_reload(tags, 1, 0) != TAGMEM_SUCCESS) {
      state.SkipWithError(tagmem_last_error());
      break;
    }
  }
  dup2(saved, STDERR_FILENO);
  close(null);
  close(saved);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(total) * 2);
  for (void* p : ptrs) tagmem_free(p, nullptr);
  restart(false, false);
}
BENCHMARK(phase_switch)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->Iterations(20);

}  // namespace

BENCHMARK_MAIN();
