// scenario_rl_two.cpp — the RL phase switch with the trainer and the engine in two processes on
// one GPU, as colocated RL runs them: one pauses (its memory back with the driver), then the
// other resumes.
//
// The runner starts itself twice (--rl-role=trainer / engine, fork + exec: nothing of CUDA
// crosses the fork) and drives both over pipes on fds 3 (commands) and 4 (replies). The trainer
// holds weights and optimizer state (BACKUP), the engine its own weights (BACKUP) and the kv cache
// (DISCARD); every tag is planned, so both pin ahead. Each child times its own calls; a cycle is
// engine pause, trainer resume, trainer pause, engine resume. Cycle 1 is reported apart, and each
// side verifies its bytes after its resume in cycle 1 and in the last cycle.
//
// Variants (--rl-variants, or --rl-two-variants): `default`, memory back with the driver between
// the two sides; `handoff`, TAGMEM_HANDOFF=on with one TAGMEM_JOB for both children, so what one
// side offloads goes to the other (Note [handoff]); `overlap`, handoff with the outgoing pause and
// the incoming resume called at the same time, so that the D2H and H2D copies share the link;
// `overlap_early`, handoff with TAGMEM_OFFLOAD_RETURN=queued and the calls one after the other,
// as a framework's RPCs make them (Note [early return]): the pause returns with its copies
// queued, and they give way to the other side's reload (Note [copies give way]);
// `overlap_early_shared`, the same with TAGMEM_HANDOFF_GIVE_WAY=off: both share the link. The
// engine pauses its kv cache before its weights and resumes its weights first; in
// `handoff` it resumes the kv cache in a call of its own after the weights, timed apart (what
// the trainer handed over maps without cuMemCreate: the kv cache is back in milliseconds). Shapes
// (--rl-two-shapes): `roomy`, the sizes as given; `tight`, where the runner maps a ballast once
// both sides exist, so that with the engine resident under 2 GiB (at most 1/16 of the trainer side)
// stays free, as when its kv cache fills the device: the trainer fits only as the engine leaves,
// and the engine only with the trainer's memory back. Each (variant, shape) runs in fresh children.
// A switch is timed from the start of the outgoing pause to the end of the incoming resume
// (CLOCK_MONOTONIC, one clock for both children; with the calls at once, from the earlier start),
// and set beside two limits from this run's raw link: sequential (B_out/D2H + B_in/H2D) and
// overlapped (max(B_in/H2D, B_out/D2H, (B_in + B_out)/bidir, and, when B_in > F + D, (B_in - F -
// D)/D2H + min(P, B_in)/H2D); B: BACKUP bytes, D: DISCARD bytes handed at once, F: free device
// memory at the switch start, P: the largest mapping, TAGMEM_MAX_MAPPING_BYTES's default). A thread
// of the runner samples free device memory throughout; its minimum is reported. To try a setting
// in one side only: RL_TWO_TRAINER_SET / RL_TWO_ENGINE_SET="NAME=value ..." (apply_side_settings).
// --rl-two-step-ms=N: the runner waits N ms after each switch (and its check) before the next, as
// an RL loop's training step and rollout separate them; 0, the default, runs them back to back,
// so that what one switch leaves running (memory going back to the driver) meets the next.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "children.hpp"
#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

const char* kTrainer[] = {"trainer_weights", "trainer_optim"};
const char* kEngineWeights[] = {"engine_weights"};
const char* kEngineKv[] = {"engine_kv"};
// Weights first: their copies start at once, while the kv cache (nothing to copy) maps last, from
// whatever memory the trainer has given back by then.
const char* kEngineAll[] = {"engine_weights", "engine_kv"};

// One side's state in its own process.
struct side {
  std::vector<std::unique_ptr<dataset>> data;
  std::vector<CUdeviceptr> kv;
  std::size_t kv_per = 0;
  bool engine = false;
  bool split_kv = false;          // the kv cache resumes in its own call, timed apart
  std::vector<double> kv_resume;  // seconds of each such call
};

std::int64_t ns(clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// "ok <seconds> <t0_ns> <t1_ns>": the call's time and its ends on the shared monotonic clock.
std::string timed_reply(clock::time_point t0) {
  const clock::time_point t1 = clock::now();
  return "ok " + std::to_string(std::chrono::duration<double>(t1 - t0).count()) + " " +
         std::to_string(ns(t0)) + " " + std::to_string(ns(t1));
}

std::string pause(side& s) {
  sync_device();
  auto t0 = clock::now();
  if (s.engine) {
    // The kv cache first: it has nothing to copy, so its memory is free (or handed) at once.
    check(tagmem_offload(kEngineKv, 1, 0, TAGMEM_DISCARD), "pause (engine kv)");
    check(tagmem_offload(kEngineWeights, 1, 0, TAGMEM_BACKUP), "pause (engine weights)");
  } else {
    check(tagmem_offload(kTrainer, 2, 0, TAGMEM_BACKUP), "pause (trainer)");
  }
  // With TAGMEM_OFFLOAD_RETURN=queued the pause returns with its copies queued
  // (tagmem_wait_released would wait for them): the framework's way of overlapping the switch.
  const char* early = std::getenv("TAGMEM_OFFLOAD_RETURN");
  if (!early || std::strcmp(early, "queued") != 0) {
    check(tagmem_wait_released(0), "tagmem_wait_released");
  }
  return timed_reply(t0);
}

std::string resume(side& s) {
  sync_device();
  auto t0 = clock::now();
  if (s.engine && s.split_kv) {
    check(tagmem_reload(kEngineWeights, 1, 0), "resume (engine weights)");
    const clock::time_point kv0 = clock::now();
    check(tagmem_reload(kEngineKv, 1, 0), "resume (engine kv)");
    s.kv_resume.push_back(std::chrono::duration<double>(clock::now() - kv0).count());
  } else if (s.engine) {
    check(tagmem_reload(kEngineAll, 2, 0), "resume (engine)");
  } else {
    check(tagmem_reload(kTrainer, 2, 0), "resume (trainer)");
  }
  return timed_reply(t0);
}

// "ok 0 <received bytes> <of those mapped>" of this side's handoff; zeros without it.
std::string handoff_reply() {
  tagmem_handoff_stats h{};
  if (tagmem_handoff_stats_get(0, &h) != TAGMEM_SUCCESS) return "ok 0 0 0";
  return "ok 0 " + std::to_string(h.received_bytes) + " " + std::to_string(h.mapped_received_bytes);
}

bool verify_side(env& e, side& s, int round) {
  bool ok = true;
  for (auto& d : s.data) ok = verify(e, *d, "rl_two_process " + d->tag(), round, false) && ok;
  if (s.engine) ok = check_windows(s.kv, s.kv_per, e.pat, round) == 0 && ok;
  return ok;
}

std::string c1_steady_ms(const std::vector<double>& v) {
  std::vector<double> rest(v.begin() + 1, v.end());
  return fixed(v[0] * 1e3, 1) + " / " + fixed(median(rest) * 1e3, 1);
}

// "ok <cycle 1 s> <steady s>" of the engine's kv cache resumes timed apart; "ok 0 -1" when none
// were (or too few).
std::string kv_reply(const side& s) {
  if (s.kv_resume.size() < 2) return "ok 0 -1";
  std::vector<double> rest(s.kv_resume.begin() + 1, s.kv_resume.end());
  return "ok " + std::to_string(s.kv_resume[0]) + " " + std::to_string(median(rest));
}

// RL_TWO_TRAINER_SET / RL_TWO_ENGINE_SET ("NAME=value NAME=value"): settings for that side only,
// to try one in one process of the pair (the runner's environment reaches both children).
void apply_side_settings(const std::string& role) {
  const std::string name = role == "engine" ? "RL_TWO_ENGINE_SET" : "RL_TWO_TRAINER_SET";
  const char* list = std::getenv(name.c_str());
  for (std::string rest = list ? list : ""; !rest.empty();) {
    const std::size_t space = rest.find(' ');
    const std::string item = rest.substr(0, space);
    rest = space == std::string::npos ? "" : rest.substr(space + 1);
    const std::size_t eq = item.find('=');
    if (item.empty()) continue;
    if (eq == std::string::npos || eq == 0)
      throw std::runtime_error(name + ": not NAME=value: " + item);
    setenv(item.substr(0, eq).c_str(), item.substr(eq + 1).c_str(), 1);
  }
}

}  // namespace

int run_rl_role(env& e, const std::string& role) {
  FILE *in = nullptr, *out = nullptr;
  if (!parent_pipes(&in, &out, "--rl-role")) return 2;
  side s;
  int round = 0;
  try {
    apply_side_settings(role);
    session tm;
    const auto sizes = weights_sizes(e.opt.scale);
    s.engine = role == "engine";
    s.split_kv = s.engine && std::getenv("RL_TWO_SPLIT_KV") != nullptr;
    if (s.engine) {
      check(tagmem_tag_plan_offload("engine_weights", 0, TAGMEM_BACKUP), "plan");
      check(tagmem_tag_plan_offload("engine_kv", 0, TAGMEM_DISCARD), "plan");
      s.data.push_back(std::make_unique<dataset>("engine_weights", sizes));
      s.data.back()->fill(e.pat, 31);
      s.kv_per = std::max<std::size_t>(2u << 20, e.opt.kv_bytes / 32 / (2u << 20) * (2u << 20));
      for (int i = 0; i < 32; ++i) {
        void* p = nullptr;
        check(tagmem_malloc_tagged(&p, s.kv_per, "engine_kv", 0, nullptr), "kv");
        s.kv.push_back(reinterpret_cast<CUdeviceptr>(p));
      }
    } else {
      check(tagmem_tag_plan_offload("trainer_weights", 0, TAGMEM_BACKUP), "plan");
      check(tagmem_tag_plan_offload("trainer_optim", 0, TAGMEM_BACKUP), "plan");
      s.data.push_back(std::make_unique<dataset>("trainer_weights", sizes));
      s.data.back()->fill(e.pat, 21);
      s.data.push_back(std::make_unique<dataset>("trainer_optim", sizes));
      s.data.back()->fill(e.pat, 22);
    }
    serve(in, out, [&](const std::string& cmd) -> std::string {
      if (cmd == "pause") return pause(s);
      if (cmd == "resume") return resume(s);
      if (cmd == "handoff") return handoff_reply();
      if (cmd == "kv") return kv_reply(s);
      if (cmd == "verify") return verify_side(e, s, ++round) ? "ok 0" : "fail bytes differ";
      return {};
    });
    for (CUdeviceptr p : s.kv) tagmem_free(reinterpret_cast<void*>(p), nullptr);
    s.data.clear();
  } catch (const std::exception& ex) {
    reply_line(out, std::string("fail ") + ex.what());
    return 1;
  }
  return 0;
}

namespace {

struct two_variant {
  std::string name;
  bool handoff = false;
  bool at_once = false;  // pause and resume called at the same time
  bool early = false;    // TAGMEM_OFFLOAD_RETURN=queued
  bool shared = false;   // TAGMEM_HANDOFF_GIVE_WAY=off
};

// Free device memory, sampled every millisecond on a thread of the runner; the minimum.
class free_sampler {
 public:
  free_sampler() : thread_([this] { run(); }) {}
  ~free_sampler() {
    stop_ = true;
    thread_.join();
  }
  std::size_t min() const { return min_; }

 private:
  void run() {
    while (!stop_) {
      const tagmem_device_stats d = device_stats();
      min_ = std::min<std::size_t>(min_, d.device_free_bytes);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> min_{~std::size_t{0}};
  std::thread thread_;
};

// The limits of one switch direction (see the top of this file), in seconds.
struct limits {
  double sequential = 0, overlapped = 0;
};

limits limits_of(const link_speed& l, double b_out, double b_in, double d, double f, double p) {
  limits r;
  r.sequential = b_out / (l.d2h * 1e9) + b_in / (l.h2d * 1e9);
  // Bytes that fit neither in free memory nor in what DISCARD hands over at once come from the
  // out-side's BACKUP mappings, no faster than D2H copies them; the last run still comes in after.
  const double short_bytes = std::max(0.0, b_in - f - d);
  const double tight =
      short_bytes > 0 ? short_bytes / (l.d2h * 1e9) + std::min(p, b_in) / (l.h2d * 1e9) : 0;
  r.overlapped = std::max(
      {b_in / (l.h2d * 1e9), b_out / (l.d2h * 1e9), (b_in + b_out) / (l.bidir * 1e9), tight});
  // Where both directions at once are slower than one after the other (an emulated link), the
  // two sides would take turns.
  r.overlapped = std::min(r.overlapped, r.sequential);
  return r;
}

void run_one(env& e, const std::vector<std::string>& child_args, const two_variant& v,
             const std::string& shape) {
  const bool plain = v.name == "default" && shape == "roomy";
  const std::string name =
      plain ? std::string("rl_two_process") : "rl_two_process[" + v.name + "," + shape + "]";
  auto args_for = [&](const char* role) {
    std::vector<std::string> a = {"tagmem_bench_offload", std::string("--rl-role=") + role};
    a.insert(a.end(), child_args.begin(), child_args.end());
    return a;
  };
  session runner;  // the ballast and the free-memory samples; before the variant's settings
  std::vector<std::pair<std::string, std::string>> vars;
  if (v.handoff) {
    vars = {{"TAGMEM_HANDOFF", "on"},
            {"TAGMEM_JOB", "rl-two-" + std::to_string(getpid()) + "-" + v.name + "-" + shape}};
  }
  if (v.early) vars.push_back({"TAGMEM_OFFLOAD_RETURN", "queued"});
  if (v.shared) vars.push_back({"TAGMEM_HANDOFF_GIVE_WAY", "off"});
  const bool split_kv = v.handoff && !v.at_once && !v.early;
  if (split_kv) vars.push_back({"RL_TWO_SPLIT_KV", "1"});
  env_override settings(vars);
  const std::size_t weights = sum(weights_sizes(e.opt.scale));
  const double trainer_bytes = 2.0 * weights;
  child trainer{"trainer"}, engine{"engine"};
  std::vector<double> ep, tr, tp, er, to_trainer, to_engine;
  std::vector<double> free_to_trainer, free_to_engine;
  std::vector<void*> ballast;
  answer trainer_handoff, engine_handoff, engine_kv;
  std::size_t min_free = 0;
  bool ok = true;
  try {
    free_sampler sampler;
    trainer = spawn("trainer", args_for("trainer"));
    ask(trainer.to, trainer.from, "trainer", "pause");  // so that the engine fits
    engine = spawn("engine", args_for("engine"));
    if (shape == "tight") {
      const std::size_t left =
          std::min<std::size_t>(std::size_t(trainer_bytes / 16), std::size_t(3) << 29);
      std::size_t b = device_stats().device_free_bytes;
      b = b > left ? (b - left) / (2u << 20) * (2u << 20) : 0;
      for (std::size_t at = 0; at < b;) {
        const std::size_t n = std::min<std::size_t>(b - at, std::size_t(1) << 30);
        void* p = nullptr;
        check(tagmem_malloc_tagged(&p, n, "rl_two_ballast", 0, nullptr), "ballast");
        ballast.push_back(p);
        at += n;
      }
    }
    auto step = [&] {  // the training step, the rollout
      std::this_thread::sleep_for(std::chrono::milliseconds(e.opt.rl_two_step_ms));
    };
    for (int c = 1; c <= e.opt.cycles; ++c) {
      const bool check_now = c == 1 || c == e.opt.cycles;
      free_to_trainer.push_back(double(device_stats().device_free_bytes));
      auto call_pair = [&](child& out, child& in) {
        if (v.at_once) return ask_both(out, "pause", in, "resume");
        const answer a = ask_full(out.to, out.from, out.who, "pause");
        return std::make_pair(a, ask_full(in.to, in.from, in.who, "resume"));
      };
      auto switch_s = [](const answer& a, const answer& b) {
        return (b.b - std::min(a.a, b.a)) / 1e9;
      };
      const auto [a, b] = call_pair(engine, trainer);
      ep.push_back(a.seconds);
      tr.push_back(b.seconds);
      to_trainer.push_back(switch_s(a, b));
      if (check_now) ask(trainer.to, trainer.from, "trainer", "verify");
      step();
      free_to_engine.push_back(double(device_stats().device_free_bytes));
      const auto [c2, d] = call_pair(trainer, engine);
      tp.push_back(c2.seconds);
      er.push_back(d.seconds);
      to_engine.push_back(switch_s(c2, d));
      if (check_now) ask(engine.to, engine.from, "engine", "verify");
      step();
      std::printf(
          "[%s] cycle %d: engine pause %.1f ms, trainer resume %.1f ms, trainer pause %.1f ms, "
          "engine resume %.1f ms\n",
          name.c_str(), c, ep.back() * 1e3, tr.back() * 1e3, tp.back() * 1e3, er.back() * 1e3);
      std::fflush(stdout);
    }
    trainer_handoff = ask_full(trainer.to, trainer.from, "trainer", "handoff");
    engine_handoff = ask_full(engine.to, engine.from, "engine", "handoff");
    engine_kv = ask_full(engine.to, engine.from, "engine", "kv");
    min_free = sampler.min();
  } catch (const std::exception& ex) {
    std::printf("[%s] ERROR: %s\n", name.c_str(), ex.what());
    ok = false;
  }
  for (child* c : {&engine, &trainer}) {
    try {
      finish(*c);
    } catch (const std::exception& ex) {
      std::printf("[%s] ERROR: %s\n", name.c_str(), ex.what());
      ok = false;
    }
  }
  for (void* p : ballast) tagmem_free(p, nullptr);
  if (!ok || ep.size() < 2) {
    e.ok = false;
    e.out.add(name, "ERROR", "-", "see the log");
    return;
  }
  const double kv = double(e.opt.kv_bytes / 32 / (2u << 20) * (2u << 20)) * 32;
  std::vector<double> rest(tr.begin() + 1, tr.end());
  const double rate = trainer_bytes / 1e9 / median(rest);
  e.out.add(
      name, "engine pause ms (c1 / steady)", c1_steady_ms(ep),
      v.handoff ? "memory to the trainer, the rest to the driver" : "memory back with the driver");
  e.out.add(name, "trainer resume ms (c1 / steady)", c1_steady_ms(tr),
            fixed(rate, 1) + " GB/s steady = " + fixed(rate / e.link.h2d, 3) +
                " of link (target >= 0.97)");
  e.out.add(
      name, "trainer pause ms (c1 / steady)", c1_steady_ms(tp),
      v.handoff ? "memory to the engine, the rest to the driver" : "memory back with the driver");
  e.out.add(name, "engine resume ms (c1 / steady)", c1_steady_ms(er),
            split_kv ? "weights, then kv in its own call" : "weights + kv");
  if (split_kv && engine_kv.a >= 0) {
    e.out.add(name, "engine kv resume ms (c1 / steady)",
              fixed(engine_kv.seconds * 1e3, 2) + " / " + fixed(engine_kv.a * 1e3, 2),
              "its own call after the weights; target <= 3 ms with handed memory (no create)");
  }
  if (plain) return;                              // the rows of the plain run stay as they were
  const double p = double(std::size_t(1) << 30);  // TAGMEM_MAX_MAPPING_BYTES's default
  const limits lt =
      limits_of(e.link, double(weights), trainer_bytes, kv,
                median(std::vector<double>(free_to_trainer.begin() + 1, free_to_trainer.end())), p);
  const limits le =
      limits_of(e.link, trainer_bytes, double(weights), 0,
                median(std::vector<double>(free_to_engine.begin() + 1, free_to_engine.end())), p);
  auto direction = [&](const char* to, const std::vector<double>& sw, const limits& l) {
    std::vector<double> steady(sw.begin() + 1, sw.end());
    e.out.add(name, std::string("switch to ") + to + " ms (c1 / steady)", c1_steady_ms(sw),
              "sequential limit " + fixed(l.sequential * 1e3, 1) + " ms, overlapped limit " +
                  fixed(l.overlapped * 1e3, 1) + " ms; steady / overlapped " +
                  fixed(median(steady) / l.overlapped, 3) + " (target <= 1.1)");
  };
  direction("trainer", to_trainer, lt);
  direction("engine", to_engine, le);
  e.out.add(name, "received by trainer / engine (GB, all cycles)",
            fixed(trainer_handoff.a / 1e9, 2) + " / " + fixed(engine_handoff.a / 1e9, 2),
            fixed(trainer_handoff.b / 1e9, 2) + " / " + fixed(engine_handoff.b / 1e9, 2) +
                " mapped without cuMemCreate");
  e.out.add(name, "min free device memory (MiB)", fixed(double(min_free) / (1ull << 20), 1),
            "sampled every ms in the runner; the two sides never exceed the device");
}

}  // namespace

bool is_rl_two_variant(const std::string& name) {
  return name == "default" || name == "handoff" || name == "overlap" || name == "overlap_early" ||
         name == "overlap_early_shared";
}

void run_rl_two_process(env& e, const std::vector<std::string>& child_args) {
  std::vector<two_variant> variants;
  for (const std::string& want : split(e.opt.rl_two_variants)) {
    if (!is_rl_two_variant(want)) {
      throw std::runtime_error("--rl-two-variants: unknown variant '" + want +
                               "' (default, handoff, overlap, overlap_early, "
                               "overlap_early_shared)");
    }
    const bool early = want == "overlap_early" || want == "overlap_early_shared";
    variants.push_back(
        {want, want != "default", want == "overlap", early, want == "overlap_early_shared"});
  }
  for (const std::string& shape : split(e.opt.rl_two_shapes)) {
    if (shape != "roomy" && shape != "tight") {
      throw std::runtime_error("--rl-two-shapes: unknown shape '" + shape + "' (roomy, tight)");
    }
    for (const two_variant& v : variants) run_one(e, child_args, v, shape);
  }
}

}  // namespace tagmem::bench
