// scenarios.hpp — the scenarios of the offload benchmark (offload_bench.cpp runs them).
//
// Each scenario runs in a fresh tagmem (init … shutdown), moves data through tagmem's public C
// API only, times the calls themselves (offload, reload and swap are synchronous: they return
// once the bytes are where they belong), and verifies every byte outside the timed region.
// Rates are user bytes (the sum of tensor sizes, not the mapped bytes) per second, in GB/s
// (1e9), compared with the raw link measured in the same run.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "dataset.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::bench {

struct options {
  double scale = 1.0;               // multiplies every default size
  int cycles = 5;                   // offload/reload cycles per scenario (>= 2)
  int swap_cycles = 3;              // measured phase-switch pairs in the swap scenarios
  std::size_t small_count = 10240;  // tensors of the many-small scenario
  std::size_t kv_bytes = 0;         // 60 GiB x scale unless given
  std::size_t link_bytes = 0;       // 4 GiB x scale (at least 64 MiB) unless given
};

struct link_speed {
  double h2d = 0, d2h = 0, bidir = 0;  // GB/s, the best way each was measured
};

struct env {
  const options& opt;
  results& out;
  const pattern& pat;
  link_speed link;
  bool ok = true;  // false once a verification or a tagmem call failed
};

// The tensor sizes of an 8B-parameter transformer in bf16 (291 tensors, 16.06 GB at scale 1).
std::vector<std::size_t> weights_sizes(double scale);
// `count` tensors of mixed sizes adding up to about `total` bytes.
std::vector<std::size_t> many_small_sizes(std::size_t total, std::size_t count);
std::size_t sum(const std::vector<std::size_t>& sizes);

link_speed run_raw_link(env& e);
void run_weights(env& e, const std::string& name, const std::vector<std::size_t>& sizes,
                 bool prepin);
void run_kv_cache(env& e);
void run_swap(env& e, bool tight);

// Fresh tagmem for one scenario (configuration from TAGMEM_* variables).
class session {
 public:
  session();
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;
};

// Throws std::runtime_error naming the call, the status and tagmem's message on failure.
void check(int status, const char* what);
tagmem_tag_stats tag_stats(const char* tag);
tagmem_device_stats device_stats();
void sync_device();

// Verifies `d` (in cycle `cycle`); the first verification of a scenario also proves the check
// fails when one byte is wrong. Records failures in e.ok and the log; returns whether it passed.
bool verify(env& e, dataset& d, const std::string& scenario, int cycle, bool prove_failure);

}  // namespace tagmem::bench
