// rl_step_demo.cpp — the main job: a colocated RL step loop on one GPU.
//
// A "trainer" (tags trainer_weights and optimizer, offloaded with BACKUP) and a rollout "engine"
// (engine_weights with BACKUP, kv_cache with DISCARD) take turns on device 0. Every tensor holds
// random bytes; after each phase switch every byte that must have survived is checked, and a
// table row reports free device memory, bytes moved, time and GB/s. Exit status 0 only if every
// check passed.
//
//   tagmem_demo [--cycles N] [--scale S] [--help]   S multiplies the default sizes (GPU: 4+8 GiB
//   trainer,
//                                           4+24 GiB engine; emulator: 1/32 of that)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_calls.hpp"
#include "driver_choice.hpp"
#include "tagmem/tagmem.h"
#include "workload.hpp"

namespace tagmem::demo {
namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

struct options {
  int cycles = 3;
  double scale = 1.0;
};

void print_usage(std::FILE* to, const char* program) {
  std::fprintf(
      to,
      "usage: %s [--cycles N] [--scale S] [--help]\n"
      "\n"
      "A colocated RL step loop on device 0: a trainer (trainer_weights and optimizer, offloaded\n"
      "with BACKUP) and a rollout engine (engine_weights with BACKUP, kv_cache with DISCARD) take\n"
      "turns. Every tensor holds random bytes, checked after each phase switch; a table row\n"
      "reports free device memory, bytes moved, time and GB/s. Exit status 0 only if every check\n"
      "passed.\n"
      "\n"
      "options:\n"
      "  --cycles N  trainer/engine cycles to run (default 3, at least 1)\n"
      "  --scale S   multiplies the default sizes (default 1; GPU: 4+8 GiB trainer, 4+24 GiB\n"
      "              engine; emulated driver: 1/32 of that)\n"
      "  --help      prints this and exits\n"
      "\n"
      "environment:\n"
      "  TAGMEM_LIBCUDA  the driver library to load (without a GPU the demo uses the emulated\n"
      "                  driver and says so on its first line)\n"
      "  TAGMEM_LOG, TAGMEM_TRACE and the other TAGMEM_* settings apply (docs/observe.md)\n",
      program);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--cycles" && i + 1 < argc) {
      o.cycles = std::atoi(argv[++i]);
    } else if (a == "--scale" && i + 1 < argc) {
      o.scale = std::atof(argv[++i]);
    } else if (a == "--help" || a == "-h") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else {
      std::fprintf(stderr, "%s: unknown or incomplete option '%s'\n", argv[0], a.c_str());
      print_usage(stderr, argv[0]);
      std::exit(2);
    }
  }
  if (o.cycles < 1 || o.scale <= 0) {
    std::fprintf(stderr, "--cycles must be >= 1 and --scale > 0\n");
    std::exit(2);
  }
  return o;
}

void ok(tagmem_status s, const char* what) {
  if (s != TAGMEM_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": " + tagmem_status_string(s) + ": " +
                             tagmem_last_error());
  }
}

std::uint64_t moved_bytes(const std::vector<const char*>& tags) {
  std::uint64_t n = 0;
  for (const char* t : tags) {
    tagmem_tag_stats s{};
    ok(tagmem_tag_stats_get(t, 0, &s), "tagmem_tag_stats_get");
    n += s.bytes_offloaded + s.bytes_reloaded;
  }
  return n;
}

// Free device memory once the releases a phase switch queued (Note [background release]) are
// done: what the next phase has to work with. Called outside the timed region.
double free_gib() {
  ok(tagmem_wait_released(0), "tagmem_wait_released");
  tagmem_device_stats s{};
  ok(tagmem_device_stats_get(0, &s), "tagmem_device_stats_get");
  return s.device_free_bytes / GiB;
}

struct phase_row {
  int cycle;
  const char* name;
  double free_gib, moved_gib, ms;
};

// One line: which tags are on the device now and which wait offloaded.
void print_residency(const std::vector<const char*>& tags) {
  std::string on = "", off = "";
  for (const char* t : tags) {
    tagmem_tag_stats s{};
    ok(tagmem_tag_stats_get(t, 0, &s), "tagmem_tag_stats_get");
    if (s.state == TAGMEM_RESIDENT) {
      on += std::string(" ") + t;
    } else {
      off += std::string(" ") + t + (s.state == TAGMEM_OFFLOADED_BACKUP ? "(backup)" : "(discard)");
    }
  }
  std::printf("       resident:%s | offloaded:%s\n", on.empty() ? " none" : on.c_str(),
              off.empty() ? " none" : off.c_str());
  std::fflush(stdout);
}

std::size_t host_pinned() {
  tagmem_device_stats s{};
  ok(tagmem_device_stats_get(0, &s), "tagmem_device_stats_get");
  return s.host_pinned_bytes;
}

// A switch that had to pin host memory for its backups is slow for that reason alone (pinning
// costs more than copying); say so, since it happens in the first cycle unless the store was
// pinned beforehand with tagmem_host_reserve.
void explain_pinning(std::size_t before) {
  const std::size_t after = host_pinned();
  if (after <= before) return;
  std::printf(
      "       (this switch first pinned %.2f GiB of host memory for the backups, which costs more "
      "than copying it; later switches reuse it; tagmem_host_reserve() at start avoids it)\n",
      (after - before) / GiB);
  std::fflush(stdout);
}

void print_row(const phase_row& r) {
  double gbps = r.ms > 0 ? (r.moved_gib * GiB / 1e9) / (r.ms / 1e3) : 0.0;
  std::printf("%5d  %-16s %10.2f %10.2f %10.1f %8.1f\n", r.cycle, r.name, r.free_gib, r.moved_gib,
              r.ms, gbps);
  std::fflush(stdout);
}

bool check_all(pattern_source& src, const std::vector<tensor>& ts, const char* what) {
  for (const tensor& t : ts) {
    if (!src.check(t)) {
      std::printf("CORRUPTION: a tensor of %s at %p (%zu bytes) differs after the switch\n", what,
                  t.ptr, t.size);
      return false;
    }
  }
  return true;
}

// A training or inference step: rewrite a random quarter of the tensors with fresh bytes.
void step(pattern_source& src, std::vector<tensor>& ts) {
  for (tensor& t : ts) {
    if (src.rng()() % 4) continue;
    t.offset = src.random_offset();
    src.write(t);
  }
}

int run(int argc, char** argv) {
  options opt = parse(argc, argv);
  driver_choice drv = choose_driver(argv[0]);
  if (drv.emulated) {
    std::printf(
        "tagmem demo: no GPU (%s): running on the EMULATED CUDA driver %s; timings are "
        "host memcpy speeds, not a GPU's\n",
        drv.why.c_str(), drv.library.c_str());
  } else {
    std::printf("tagmem demo: running on the real CUDA driver %s (%s)\n", drv.library.c_str(),
                drv.why.c_str());
  }
  ok(tagmem_init(nullptr), "tagmem_init");

  // The demo's own copies run in device 0's primary context, as an application's would.
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuda().device_get(&dev, 0) != CUDA_SUCCESS || cuda().primary_ctx_retain(&ctx, dev) ||
      cuda().ctx_set_current(ctx)) {
    throw std::runtime_error("cannot make device 0's primary context current");
  }

  const double unit = (drv.emulated ? GiB / 32 : GiB) * opt.scale;
  const auto bytes = [&](double n) { return static_cast<std::size_t>(n * unit); };
  pattern_source src(64u << 20, std::random_device{}());

  std::printf(
      "sizes: trainer_weights %.2f GiB, optimizer %.2f GiB, engine_weights %.2f GiB, "
      "kv_cache %.2f GiB; device free %.2f GiB\n",
      bytes(4) / GiB, bytes(8) / GiB, bytes(4) / GiB, bytes(24) / GiB, free_gib());
  auto trainer_w = make_tensors(src, "trainer_weights", bytes(4), 64u << 20);
  auto optimizer = make_tensors(src, "optimizer", bytes(8), 128u << 20);
  auto engine_w = make_tensors(src, "engine_weights", bytes(4), 64u << 20);
  auto kv = make_tensors(src, "kv_cache", bytes(24), 512u << 20);

  const char* kv_tag[] = {"kv_cache"};
  const char* engine_w_tag[] = {"engine_weights"};
  const char* trainer_tags[] = {"trainer_weights", "optimizer"};
  const std::vector<const char*> all = {"trainer_weights", "optimizer", "engine_weights",
                                        "kv_cache"};

  // Start in the trainer phase: the engine sleeps.
  ok(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD), "offload kv_cache");
  ok(tagmem_offload(engine_w_tag, 1, 0, TAGMEM_BACKUP), "offload engine_weights");
  print_residency(all);

  std::printf("\n%5s  %-16s %10s %10s %10s %8s\n", "cycle", "phase", "free GiB", "moved GiB", "ms",
              "GB/s");
  bool good = true;
  using clock = std::chrono::steady_clock;
  for (int cycle = 1; cycle <= opt.cycles && good; ++cycle) {
    step(src, trainer_w);
    step(src, optimizer);

    // trainer -> engine: trainer out (BACKUP), engine weights and a fresh kv cache in.
    std::uint64_t before = moved_bytes(all);
    std::size_t pinned_before = host_pinned();
    auto t0 = clock::now();
    ok(tagmem_swap(trainer_tags, 2, engine_w_tag, 1, 0, TAGMEM_BACKUP), "swap to engine");
    ok(tagmem_reload(kv_tag, 1, 0), "reload kv_cache");
    double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    print_row({cycle, "trainer->engine", free_gib(), (moved_bytes(all) - before) / GiB, ms});
    print_residency(all);
    explain_pinning(pinned_before);
    good = check_all(src, engine_w, "engine_weights");
    for (tensor& t : kv) src.write(t);              // the engine fills its cache...
    good = good && check_all(src, kv, "kv_cache");  // ...and reads it back
    step(src, engine_w);

    // engine -> trainer: the cache is dropped, engine weights backed up, trainer back.
    before = moved_bytes(all);
    pinned_before = host_pinned();
    t0 = clock::now();
    ok(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD), "offload kv_cache");
    ok(tagmem_swap(engine_w_tag, 1, trainer_tags, 2, 0, TAGMEM_BACKUP), "swap to trainer");
    ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    print_row({cycle, "engine->trainer", free_gib(), (moved_bytes(all) - before) / GiB, ms});
    print_residency(all);
    explain_pinning(pinned_before);
    good = good && check_all(src, trainer_w, "trainer_weights") &&
           check_all(src, optimizer, "optimizer");
  }

  std::printf("\n%s: %.2f GiB checked byte for byte across %d cycles\n", good ? "OK" : "FAILED",
              src.bytes_checked() / GiB, opt.cycles);
  for (auto* v : {&trainer_w, &optimizer, &engine_w, &kv})
    for (tensor& t : *v) ok(tagmem_free(t.ptr, nullptr), "tagmem_free");
  ok(tagmem_shutdown(), "tagmem_shutdown");
  return good ? 0 : 1;
}

}  // namespace
}  // namespace tagmem::demo

int main(int argc, char** argv) {
  try {
    return tagmem::demo::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tagmem demo failed: %s\n", e.what());
    return 1;
  }
}
