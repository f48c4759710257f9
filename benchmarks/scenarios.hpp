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
  std::string rl_variants = "default,no_pin_ahead,keep,settle,no_kv";  // scenario_rl_cycle.cpp
  std::string rl_discard_sweep;  // TAGMEM_DISCARD_MAPPING_BYTES values for rl_cycle, "1G,2G"
  // scenario_rl_two.cpp: default, handoff, overlap, overlap_early, overlap_early_shared
  std::string rl_two_variants = "default";
  std::string rl_two_shapes = "roomy";  // scenario_rl_two.cpp: roomy, tight
  int rl_two_step_ms = 0;  // scenario_rl_two.cpp: a side's work between its resume and its pause
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
void run_rl_cycle(env& e);
// TAGMEM_BACKUP_DISK beside the disk's own rate (TAGMEM_BENCH_DISK_DIR; not in the default list).
void run_disk(env& e);
// The two-process variant starts this program twice with --rl-role and `child_args` (the sizes);
// run_rl_role is what such a child runs (returns its exit status).
void run_rl_two_process(env& e, const std::vector<std::string>& child_args);
// Whether `name` is a variant of rl_two_process (--rl-variants serves both RL scenarios).
bool is_rl_two_variant(const std::string& name);
int run_rl_role(env& e, const std::string& role);
// Replicated tags (docs/replicated.md): two processes holding the same replicated tag, on device 0
// or on a GPU each (`gpus` 2), started with --replica-role and `child_args`; run_replica_role is
// what such a child runs (returns its exit status).
void run_replicated(env& e, const std::vector<std::string>& child_args, int gpus);
int run_replica_role(env& e, int rank);

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

// Writes and reads back a window at each end of each of `ptrs` (tensors of `bytes`); returns the
// windows that failed. For DISCARDed memory, whose contents are undefined: it must be usable.
int check_windows(const std::vector<CUdeviceptr>& ptrs, std::size_t bytes, const pattern& pat,
                  int cycle);

}  // namespace tagmem::bench
