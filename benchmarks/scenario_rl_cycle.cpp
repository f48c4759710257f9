// scenario_rl_cycle.cpp — the RL phase switch as users run it, in one process: the trainer's
// weights and optimizer state (BACKUP) and the engine's kv cache (DISCARD) go out and come back
// each cycle, measured against the raw link of the same run.
//
// A cycle, each step timed after a device synchronize: pause weights (offload weights + optimizer,
// BACKUP), pause kv (offload DISCARD, then tagmem_wait_released: the memory back with the
// driver, as another process or allocator would need it), resume kv, resume weights. Cycle 1 is
// reported apart (it pins the host store unless that was pinned ahead); steady is the median of
// cycles 2..N. The variants, each in a fresh tagmem, are the A/B of each mechanism:
//   default        what a user gets: pin ahead on (the tags are planned), recycling in swaps, the
//                  copy kernel beside the copy engines after a release
//   copy_engines   TAGMEM_COPY_KERNEL=off: every reload copy on the copy engines
//   kernel_always  TAGMEM_COPY_KERNEL=always: the copy kernel shares every reload
//   no_pin_ahead   TAGMEM_PIN_AHEAD=off: cycle 1 pins during the first offload
//   keep           TAGMEM_RECYCLE_PHYSICAL=keep and no wait for the release: physical memory stays
//                  in the process and the resumes map it again (one process holds both sides)
//   settle         the default with 500 ms between the pauses and the resumes: a diagnostic of
//                  what a release still running in the driver costs the resumes
//   no_kv          the default without the kv cache: the resumes with nothing released beside
//                  them but the trainer's own memory
// and, with --rl-discard-sweep=1G,2G,..., the default once per TAGMEM_DISCARD_MAPPING_BYTES.
// Weights and optimizer bytes are verified after the last cycle (and after cycle 1 of the first
// variant, which also proves the check fails on a flipped byte); the kv cache's windows after
// every resume.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

struct variant {
  std::string label;
  std::vector<std::pair<std::string, std::string>> env;
  bool plan = true;        // tagmem_tag_plan_offload for the three tags
  bool release_kv = true;  // pause kv waits until the memory is back with the driver
  int settle_ms = 0;
  bool with_kv = true;  // false: the kv cache stays out of the cycle (nothing else is released)
};

struct cycle_times {
  std::vector<double> pause_w, pause_kv, resume_kv, resume_w;
};

double timed(const std::function<void()>& f) {
  sync_device();
  auto t0 = clock::now();
  f();
  return seconds_since(t0);
}

cycle_times run_variant(env& e, const variant& v, bool first) {
  env_override vars(v.env);
  session s;
  const char* trainer[] = {"rl_weights", "rl_optim"};
  const char* kv_tag[] = {"rl_kv"};
  if (v.plan) {
    check(tagmem_tag_plan_offload("rl_weights", 0, TAGMEM_BACKUP), "plan (weights)");
    check(tagmem_tag_plan_offload("rl_optim", 0, TAGMEM_BACKUP), "plan (optimizer)");
    check(tagmem_tag_plan_offload("rl_kv", 0, TAGMEM_DISCARD), "plan (kv)");
  }
  const auto sizes = weights_sizes(e.opt.scale);
  dataset weights("rl_weights", sizes), optim("rl_optim", sizes);
  weights.fill(e.pat, 11);
  optim.fill(e.pat, 12);
  const std::size_t per =
      std::max<std::size_t>(2u << 20, e.opt.kv_bytes / 32 / (2u << 20) * (2u << 20));
  std::vector<CUdeviceptr> kv;
  for (int i = 0; i < 32; ++i) {
    void* p = nullptr;
    check(tagmem_malloc_tagged(&p, per, "rl_kv", 0, nullptr), "tagmem_malloc_tagged (kv)");
    kv.push_back(reinterpret_cast<CUdeviceptr>(p));
  }
  const std::string name = "rl_cycle " + v.label;
  cycle_times t;
  for (int c = 1; c <= e.opt.cycles; ++c) {
    t.pause_w.push_back(
        timed([&] { check(tagmem_offload(trainer, 2, 0, TAGMEM_BACKUP), "pause weights"); }));
    t.pause_kv.push_back(timed([&] {
      if (v.with_kv) check(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD), "pause kv");
      if (v.release_kv) check(tagmem_wait_released(0), "tagmem_wait_released");
    }));
    if (v.settle_ms) std::this_thread::sleep_for(std::chrono::milliseconds(v.settle_ms));
    t.resume_kv.push_back(timed([&] {
      if (v.with_kv) check(tagmem_reload(kv_tag, 1, 0), "resume kv");
    }));
    t.resume_w.push_back(timed([&] { check(tagmem_reload(trainer, 2, 0), "resume weights"); }));
    const int bad = check_windows(kv, per, e.pat, c);
    if (bad) e.ok = false;
    std::printf(
        "[%s] cycle %d: pause weights %.1f ms, pause kv %.2f ms, resume kv %.2f ms, resume "
        "weights %.1f ms, kv windows %s\n",
        name.c_str(), c, t.pause_w.back() * 1e3, t.pause_kv.back() * 1e3, t.resume_kv.back() * 1e3,
        t.resume_w.back() * 1e3, bad ? "WRONG" : "ok");
    std::fflush(stdout);
    if ((first && c == 1) || c == e.opt.cycles) {
      verify(e, weights, name + " weights", c, first && c == 1);
      verify(e, optim, name + " optimizer", c, false);
    }
  }
  for (CUdeviceptr p : kv) tagmem_free(reinterpret_cast<void*>(p), nullptr);
  check(tagmem_wait_released(0), "tagmem_wait_released (end)");  // kept memory too
  return t;
}

double steady(const std::vector<double>& v) {
  return median(std::vector<double>(v.begin() + 1, v.end()));
}

std::string c1_steady(const std::vector<double>& v, double unit, int digits) {
  return fixed(v[0] * unit, digits) + " / " + fixed(steady(v) * unit, digits);
}

void report(env& e, const variant& v, const cycle_times& t, std::size_t trainer_bytes) {
  const std::string name = "rl_cycle " + v.label;
  const double gb = trainer_bytes / 1e9;
  auto rate = [&](const std::vector<double>& s, double link) {
    const double r = gb / steady(s);
    return fixed(r, 1) + " GB/s steady = " + fixed(r / link, 3) + " of link";
  };
  e.out.add(name, "pause weights s (c1 / steady)", c1_steady(t.pause_w, 1, 3),
            rate(t.pause_w, e.link.d2h) + "; c1/steady " +
                fixed(t.pause_w[0] / steady(t.pause_w), 2) + " (target <= 1.5)");
  e.out.add(name, "pause kv ms (c1 / steady)", c1_steady(t.pause_kv, 1e3, 2),
            v.release_kv ? "memory back with the driver; target <= 25" : "memory kept");
  e.out.add(name, "resume kv ms (c1 / steady)", c1_steady(t.resume_kv, 1e3, 2), "target <= 5");
  e.out.add(name, "resume weights s (c1 / steady)", c1_steady(t.resume_w, 1, 3),
            rate(t.resume_w, e.link.h2d) + " (target >= 0.95)");
  std::vector<double> whole;
  for (std::size_t i = 0; i < t.pause_w.size(); ++i) {
    whole.push_back(t.pause_w[i] + t.pause_kv[i] + t.resume_kv[i] + t.resume_w[i]);
  }
  e.out.add(name, "whole cycle s (c1 / steady)", c1_steady(whole, 1, 3),
            "c1/steady " + fixed(whole[0] / steady(whole), 2) + " (target <= 1.5)");
}

}  // namespace

void run_rl_cycle(env& e) {
  std::vector<variant> all = {
      {"default", {}, true, true, 0},
      {"copy_engines", {{"TAGMEM_COPY_KERNEL", "off"}}, true, true, 0},
      {"kernel_always", {{"TAGMEM_COPY_KERNEL", "always"}}, true, true, 0},
      {"no_pin_ahead", {{"TAGMEM_PIN_AHEAD", "off"}}, true, true, 0},
      {"keep", {{"TAGMEM_RECYCLE_PHYSICAL", "keep"}}, true, false, 0},
      {"settle", {}, true, true, 500},
      {"no_kv", {}, true, true, 0, false},
  };
  std::vector<variant> chosen;
  for (const std::string& want : split(e.opt.rl_variants)) {
    bool found = false;
    for (const variant& v : all) {
      if (v.label == want) {
        chosen.push_back(v);
        found = true;
      }
    }
    if (!found) throw std::runtime_error("--rl-variants: unknown variant '" + want + "'");
  }
  for (const std::string& bytes : split(e.opt.rl_discard_sweep)) {
    chosen.push_back({"discard_mapping=" + bytes, {{"TAGMEM_DISCARD_MAPPING_BYTES", bytes}}});
  }
  const std::size_t trainer_bytes = 2 * sum(weights_sizes(e.opt.scale));
  bool first = true;
  for (const variant& v : chosen) {
    cycle_times t = run_variant(e, v, first);
    first = false;
    report(e, v, t, trainer_bytes);
  }
}

}  // namespace tagmem::bench
