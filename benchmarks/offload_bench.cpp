// offload_bench.cpp — the scenario runner: raw link, weights (with and without
// pre-pinning), many small, kv cache, swap (roomy and memory-tight), the RL cycle in one process
// and in two. Prints a progress log, then one results table; exits 1 if any byte failed
// verification or any call failed.
//
//   tagmem_bench_offload [--scenarios=raw,weights,weights_prepinned,many_small,kv,swap,swap_tight,
//                                     rl_cycle,rl_two_process,disk,replicated]
//                        [--scale=1] [--cycles=5] [--swap-cycles=3] [--small-count=10240]
//                        [--kv-bytes=60G] [--link-bytes=4G] [--tsv=results.tsv]
//                        [--link=H2D,D2H,BIDIR]
//                        [--rl-variants=default,copy_engines,kernel_always,no_pin_ahead,
//                        keep,settle,no_kv]
//                        [--rl-discard-sweep=1G,2G,4G,8G]
//                        [--rl-two-variants=default,handoff,overlap,overlap_early,
//                        overlap_early_shared]
//                        [--rl-two-shapes=roomy,tight] [--rl-two-step-ms=0]
//                        [--replica-gpus=1|2]
//
// disk and replicated run only when asked for. replicated (scenario_replicated.cpp): two
// processes holding the same replicated tag of 16 GiB x --scale, on device 0 or, with
// --replica-gpus=2, on a GPU each, beside a plain BACKUP offload of the same tag in the same run.
//
// --rl-variants serves both RL scenarios: each takes the names it knows ("default" is both's),
// and one that finds none of its own there runs its default list; --rl-two-variants, the older
// spelling for rl_two_process, overrides what it takes from --rl-variants.
//
// --scale multiplies every default size (16.06 GB of weights, 60 GiB of kv cache, 4 GiB for the
// raw link) so the same binary runs on the emulator (e.g. --scale=0.01). tagmem's own knobs
// (TAGMEM_COPY_PIECE_BYTES, TAGMEM_MAX_MAPPING_BYTES, TAGMEM_CHUNK_BYTES, TAGMEM_HOST_PIN, ...)
// come from the environment and are echoed in the header. The raw link is measured first unless
// --link gives its GB/s from an earlier run of the same machine (the chunking sweeps of
// gpu_run.sh do that to save time); every ratio is then against those numbers.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "scenarios.hpp"

using namespace tagmem::bench;

namespace {

bool wanted(const std::string& list, const std::string& name) {
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item == name || item == "all") return true;
  }
  return false;
}

// Every TAGMEM_* variable set, so that a log says which settings produced it.
void echo_environment() {
  for (char** v = environ; *v; ++v) {
    if (std::strncmp(*v, "TAGMEM_", 7) == 0) std::printf("# %s\n", *v);
  }
}

// The pattern's size: random bytes, a size that is no power of two (dataset.hpp).
std::size_t pattern_size(const options& opt) {
  return std::min<std::size_t>((256u << 20) - 4096 * 3 + 40,
                               std::max<std::size_t>(4u << 20, sum(weights_sizes(opt.scale)) / 4));
}

}  // namespace

int main(int argc, char** argv) {
  args a(argc, argv,
         {"scenarios", "scale", "cycles", "swap-cycles", "small-count", "kv-bytes", "link-bytes",
          "tsv", "link", "rl-variants", "rl-discard-sweep", "rl-role", "rl-two-variants",
          "rl-two-shapes", "rl-two-step-ms", "replica-role", "replica-gpus"});
  if (!a.ok()) {
    std::fprintf(stderr, "tagmem_bench_offload: %s\n", a.error().c_str());
    return 2;
  }
  options opt;
  std::string cycle_names, two_names;
  try {
    opt.scale = a.num("scale", 1.0);
    opt.cycles = std::max(2, int(a.num("cycles", 5)));
    opt.swap_cycles = std::max(1, int(a.num("swap-cycles", 3)));
    opt.small_count = std::max<std::size_t>(2, std::size_t(a.num("small-count", 10240)));
    opt.kv_bytes = a.bytes("kv-bytes", std::size_t(60.0 * (1ull << 30) * opt.scale));
    opt.link_bytes =
        a.bytes("link-bytes",
                std::max<std::size_t>(64u << 20, std::size_t(4.0 * (1ull << 30) * opt.scale)));
    for (const std::string& name : split(a.str("rl-variants", ""))) {
      std::string& names = is_rl_two_variant(name) ? two_names : cycle_names;
      names += (names.empty() ? "" : ",") + name;
      if (name == "default") cycle_names += (cycle_names.empty() ? "" : ",") + name;
    }
    if (!cycle_names.empty()) opt.rl_variants = cycle_names;  // rl_cycle refuses unknown names
    if (!two_names.empty()) opt.rl_two_variants = two_names;
    opt.rl_discard_sweep = a.str("rl-discard-sweep", "");
    opt.rl_two_variants = a.str("rl-two-variants", opt.rl_two_variants);
    opt.rl_two_shapes = a.str("rl-two-shapes", opt.rl_two_shapes);
    opt.rl_two_step_ms = std::max(0, int(a.num("rl-two-step-ms", 0)));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "tagmem_bench_offload: bad option: %s\n", ex.what());
    return 2;
  }
  const std::string role = a.str("rl-role", "");
  const std::string list =
      a.str("scenarios",
            "raw,weights,weights_prepinned,many_small,kv,swap,swap_tight,rl_cycle,rl_two_process");
  results out;
  bool ok = true;
  try {
    use_device0();
    if (!role.empty()) {  // a child of rl_two_process
      pattern pat(pattern_size(opt), 0x7a6d656d);
      env e{opt, out, pat, {}, true};
      return run_rl_role(e, role);
    }
    if (const std::string replica = a.str("replica-role", ""); !replica.empty()) {
      pattern pat(pattern_size(opt), 0x7a6d656d);  // a child of replicated
      env e{opt, out, pat, {}, true};
      return run_replica_role(e, replica == "1" ? 1 : 0);
    }
    std::printf("# tagmem offload benchmark on the %s driver, scale %.4g, %d cycles\n",
                using_emulator() ? "EMULATED" : "real CUDA", opt.scale, opt.cycles);
    echo_environment();
    std::fflush(stdout);
    pattern pat(pattern_size(opt), 0x7a6d656d);
    env e{opt, out, pat, {}, true};
    if (std::string given = a.str("link", ""); !given.empty()) {
      if (std::sscanf(given.c_str(), "%lf,%lf,%lf", &e.link.h2d, &e.link.d2h, &e.link.bidir) != 3 ||
          e.link.h2d <= 0 || e.link.d2h <= 0 || e.link.bidir <= 0) {
        throw std::runtime_error("--link wants three GB/s numbers: H2D,D2H,BIDIR");
      }
      out.add("raw link", "given by --link (GB/s H2D, D2H, bidir)", given, "not measured here");
    } else {
      e.link = run_raw_link(e);  // the other scenarios are ratios of it
    }
    struct item {
      const char* key;
      std::function<void()> run;
    };
    auto weights = weights_sizes(opt.scale);
    std::vector<item> items = {
        {"weights", [&] { run_weights(e, "weights", weights, false); }},
        {"weights_prepinned", [&] { run_weights(e, "weights (pre-pinned)", weights, true); }},
        {"many_small",
         [&] {
           run_weights(e, "many small", many_small_sizes(sum(weights), opt.small_count), true);
         }},
        {"kv", [&] { run_kv_cache(e); }},
        {"swap", [&] { run_swap(e, false); }},
        {"swap_tight", [&] { run_swap(e, true); }},
        {"rl_cycle", [&] { run_rl_cycle(e); }},
        {"disk", [&] { run_disk(e); }},
        {"replicated",
         [&] {
           run_replicated(e, {"--scale=" + a.str("scale", "1")}, int(a.num("replica-gpus", 1)));
         }},
        {"rl_two_process",
         [&] {
           run_rl_two_process(
               e, {"--scale=" + a.str("scale", "1"), "--kv-bytes=" + std::to_string(opt.kv_bytes),
                   "--cycles=" + std::to_string(opt.cycles)});
         }},
    };
    for (const item& it : items) {
      if (!wanted(list, it.key)) continue;
      try {
        it.run();
      } catch (const std::exception& ex) {
        std::printf("[%s] ERROR: %s\n", it.key, ex.what());
        out.add(it.key, "ERROR", "-", ex.what());
        e.ok = false;
      }
    }
    ok = e.ok;
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  out.print(std::string("tagmem offload benchmark") + (ok ? "" : " -- FAILURES, see the log"));
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
