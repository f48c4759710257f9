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
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

const char* kTrainer[] = {"trainer_weights", "trainer_optim"};
const char* kEngineWeights[] = {"engine_weights"};
const char* kEngineKv[] = {"engine_kv"};
const char* kEngineAll[] = {"engine_kv", "engine_weights"};

// One side's state in its own process.
struct side {
  std::vector<std::unique_ptr<dataset>> data;
  std::vector<CUdeviceptr> kv;
  std::size_t kv_per = 0;
  bool engine = false;
};

double pause(side& s) {
  sync_device();
  auto t0 = clock::now();
  if (s.engine) {
    check(tagmem_offload(kEngineWeights, 1, 0, TAGMEM_BACKUP), "pause (engine weights)");
    check(tagmem_offload(kEngineKv, 1, 0, TAGMEM_DISCARD), "pause (engine kv)");
  } else {
    check(tagmem_offload(kTrainer, 2, 0, TAGMEM_BACKUP), "pause (trainer)");
  }
  check(tagmem_wait_released(0), "tagmem_wait_released");
  return seconds_since(t0);
}

double resume(side& s) {
  sync_device();
  auto t0 = clock::now();
  if (s.engine) {
    check(tagmem_reload(kEngineAll, 2, 0), "resume (engine)");
  } else {
    check(tagmem_reload(kTrainer, 2, 0), "resume (trainer)");
  }
  return seconds_since(t0);
}

bool verify_side(env& e, side& s, int round) {
  bool ok = true;
  for (auto& d : s.data) ok = verify(e, *d, "rl_two_process " + d->tag(), round, false) && ok;
  if (s.engine) ok = check_windows(s.kv, s.kv_per, e.pat, round) == 0 && ok;
  return ok;
}

// Sends one command and reads the reply line ("ok <seconds>" or "fail <why>").
double ask(FILE* to, FILE* from, const char* who, const char* command) {
  std::fprintf(to, "%s\n", command);
  std::fflush(to);
  char line[1024];
  if (!std::fgets(line, sizeof line, from)) {
    throw std::runtime_error(std::string(who) + " died during '" + command + "'");
  }
  double seconds = 0;
  if (std::sscanf(line, "ok %lf", &seconds) != 1) {
    throw std::runtime_error(std::string(who) + " '" + command + "': " + line);
  }
  return seconds;
}

struct child {
  const char* who;
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;
};

child spawn(const char* who, const std::vector<std::string>& args) {
  int cmd[2], rep[2];
  if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe2 failed");
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  child c{who};
  c.pid = fork();
  if (c.pid < 0) throw std::runtime_error("fork failed");
  if (c.pid == 0) {  // only async-signal-safe calls until exec
    // Through fds above 4 first: dup2 onto an fd that is already the source keeps its
    // close-on-exec flag, and the two targets must not clobber each other's source.
    const int c_fd = fcntl(cmd[0], F_DUPFD, 10), r_fd = fcntl(rep[1], F_DUPFD, 10);
    if (c_fd < 0 || r_fd < 0 || dup2(c_fd, 3) < 0 || dup2(r_fd, 4) < 0) _exit(127);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(cmd[0]);
  close(rep[1]);
  c.to = fdopen(cmd[1], "w");
  c.from = fdopen(rep[0], "r");
  ask(c.to, c.from, who, "ready");
  return c;
}

void finish(child& c) {
  if (c.to) {
    std::fprintf(c.to, "quit\n");
    std::fclose(c.to);
  }
  if (c.from) std::fclose(c.from);
  int status = 0;
  if (c.pid > 0) waitpid(c.pid, &status, 0);
  if (c.pid > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    throw std::runtime_error(std::string(c.who) + " exited abnormally");
  }
}

std::string c1_steady_ms(const std::vector<double>& v) {
  std::vector<double> rest(v.begin() + 1, v.end());
  return fixed(v[0] * 1e3, 1) + " / " + fixed(median(rest) * 1e3, 1);
}

}  // namespace

int run_rl_role(env& e, const std::string& role) {
  FILE* in = fdopen(3, "r");
  FILE* out = fdopen(4, "w");
  if (!in || !out) {
    std::fprintf(stderr, "--rl-role is for the rl_two_process scenario's children\n");
    return 2;
  }
  side s;
  int round = 0;
  auto reply = [&](const std::string& line) {
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
  };
  try {
    session tm;
    const auto sizes = weights_sizes(e.opt.scale);
    s.engine = role == "engine";
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
    char line[256];
    while (std::fgets(line, sizeof line, in)) {
      std::string cmd(line, strcspn(line, "\n"));
      if (cmd == "quit") break;
      try {
        if (cmd == "ready") {
          reply("ok 0");
        } else if (cmd == "pause") {
          reply("ok " + std::to_string(pause(s)));
        } else if (cmd == "resume") {
          reply("ok " + std::to_string(resume(s)));
        } else if (cmd == "verify") {
          reply(verify_side(e, s, ++round) ? "ok 0" : "fail bytes differ");
        } else {
          reply("fail unknown command " + cmd);
        }
      } catch (const std::exception& ex) {
        reply(std::string("fail ") + ex.what());
      }
    }
    for (CUdeviceptr p : s.kv) tagmem_free(reinterpret_cast<void*>(p), nullptr);
    s.data.clear();
  } catch (const std::exception& ex) {
    reply(std::string("fail ") + ex.what());
    return 1;
  }
  return 0;
}

void run_rl_two_process(env& e, const std::vector<std::string>& child_args) {
  const std::string name = "rl_two_process";
  auto args_for = [&](const char* role) {
    std::vector<std::string> a = {"tagmem_bench_offload", std::string("--rl-role=") + role};
    a.insert(a.end(), child_args.begin(), child_args.end());
    return a;
  };
  child trainer{"trainer"}, engine{"engine"};
  std::vector<double> ep, tr, tp, er;
  bool ok = true;
  try {
    trainer = spawn("trainer", args_for("trainer"));
    ask(trainer.to, trainer.from, "trainer", "pause");  // so that the engine fits
    engine = spawn("engine", args_for("engine"));
    for (int c = 1; c <= e.opt.cycles; ++c) {
      const bool check_now = c == 1 || c == e.opt.cycles;
      ep.push_back(ask(engine.to, engine.from, "engine", "pause"));
      tr.push_back(ask(trainer.to, trainer.from, "trainer", "resume"));
      if (check_now) ask(trainer.to, trainer.from, "trainer", "verify");
      tp.push_back(ask(trainer.to, trainer.from, "trainer", "pause"));
      er.push_back(ask(engine.to, engine.from, "engine", "resume"));
      if (check_now) ask(engine.to, engine.from, "engine", "verify");
      std::printf(
          "[%s] cycle %d: engine pause %.1f ms, trainer resume %.1f ms, trainer pause %.1f ms, "
          "engine resume %.1f ms\n",
          name.c_str(), c, ep.back() * 1e3, tr.back() * 1e3, tp.back() * 1e3, er.back() * 1e3);
      std::fflush(stdout);
    }
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
  if (!ok || ep.size() < 2) {
    e.ok = false;
    e.out.add(name, "ERROR", "-", "see the log");
    return;
  }
  const double trainer_gb = 2.0 * sum(weights_sizes(e.opt.scale)) / 1e9;
  std::vector<double> rest(tr.begin() + 1, tr.end());
  const double rate = trainer_gb / median(rest);
  e.out.add(name, "engine pause ms (c1 / steady)", c1_steady_ms(ep), "memory back with the driver");
  e.out.add(name, "trainer resume ms (c1 / steady)", c1_steady_ms(tr),
            fixed(rate, 1) + " GB/s steady = " + fixed(rate / e.link.h2d, 3) +
                " of link (target >= 0.95)");
  e.out.add(name, "trainer pause ms (c1 / steady)", c1_steady_ms(tp),
            "memory back with the driver");
  e.out.add(name, "engine resume ms (c1 / steady)", c1_steady_ms(er), "weights + kv");
}

}  // namespace tagmem::bench
