// scenario_replicated.cpp — replicated tags (docs/replicated.md): two processes holding the same
// tag keep one host copy of it, each offload copying its half.
//
// The runner starts itself twice (--replica-role=0 / 1, through children.hpp) with one
// TAGMEM_JOB and a private TAGMEM_PEER_DIR of its own; with --replica-gpus=2 each child sees only
// GPU 0 or 1 (CUDA_VISIBLE_DEVICES), else both share device 0. Each child fills tag "rep" (16 GiB
// × --scale, 64 tensors) with the same bytes. Then, in the same run:
//  1. plain: child 0 alone offloads the tag with BACKUP and reloads it, twice (the second is
//     reported: the first pins the host store), and gives the pinned store back
//     (tagmem_host_trim); then both children at once, the same way;
//  2. replicated: both make the tag replicated (group of 2) and offload it together, then reload
//     it together, --cycles times (at least 2; cycle 1, which also maps and registers the shared
//     copy fresh, is reported apart from the last);
//  3. one after the other: child 0 offloads, then child 1 (each call returns before the next is
//     sent, as a controller that asks its workers in turn; Note [offload alone] in
//     replica/solo_offload.hpp), then both reload, --cycles times (at least 2; the last is
//     reported). Also reported: what child 0 still maps when its offload returns (the part of
//     the tag whose share child 1 has not written yet) and how long after child 1's offload it
//     takes to unmap it.
// Reported: each child's offload and reload times, the bytes each offload moved (the tag's
// bytes_offloaded, from tagmem's statistics), host memory while offloaded (the machine's Shmem
// and MemAvailable against before, each child's RssShmem and VmRSS), and every byte of both
// children verified after each reload.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "children.hpp"
#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

const char* kTag[] = {"rep"};

std::vector<std::size_t> replica_sizes(double scale) {
  const auto each = static_cast<std::size_t>(256.0 * (1 << 20) * scale) / 4096 * 4096;
  return std::vector<std::size_t>(64, std::max<std::size_t>(each, 4096));
}

// A "Key:   123 kB" line of a /proc file, in bytes (0 if absent).
double proc_bytes(const char* file, const char* key) {
  std::ifstream in(file);
  const std::string want = std::string(key) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(want, 0) == 0) return std::strtod(line.c_str() + want.size(), nullptr) * 1024;
  }
  return 0;
}

std::string gib(double bytes) { return fixed(bytes / double(1ull << 30), 2) + " GiB"; }
std::string signed_gib(double bytes) { return (bytes >= 0 ? "+" : "") + gib(bytes); }

// "ok <seconds> <bytes moved by this call> <host bytes of the tag>".
std::string offload_reply(double seconds, std::uint64_t moved_before) {
  const tagmem_tag_stats s = tag_stats(kTag[0]);
  return "ok " + std::to_string(seconds) + " " + std::to_string(s.bytes_offloaded - moved_before) +
         " " + std::to_string(s.host_bytes);
}

std::string timed(const std::function<void()>& call) {
  sync_device();
  const auto t0 = clock::now();
  call();
  return "ok " + std::to_string(seconds_since(t0));
}

std::string offload_now() {
  const std::uint64_t before = tag_stats(kTag[0]).bytes_offloaded;
  sync_device();
  const auto t0 = clock::now();
  check(tagmem_offload(kTag, 1, 0, TAGMEM_BACKUP), "offload");
  return offload_reply(seconds_since(t0), before);
}

}  // namespace

int run_replica_role(env& e, int rank) {
  FILE *in = nullptr, *out = nullptr;
  if (!parent_pipes(&in, &out, "--replica-role")) return 2;
  try {
    session tm;
    dataset d(kTag[0], replica_sizes(e.opt.scale));
    int round = 0;
    serve(in, out, [&](const std::string& cmd) -> std::string {
      if (cmd == "fill") {
        d.fill(e.pat, 41);  // the same bytes in both replicas
        return "ok 0 " + std::to_string(tag_stats(kTag[0]).mapped_bytes);
      }
      if (cmd == "plain") {  // twice: the first pins the host store
        std::string r;
        for (int i = 0; i < 2; ++i) {
          r = offload_now();
          check(tagmem_reload(kTag, 1, 0), "reload");
        }
        check(tagmem_host_trim(0), "tagmem_host_trim");
        return r;
      }
      if (cmd == "replicate") {
        check(tagmem_set_replicated(kTag[0], 0, "bench", rank, 2), "tagmem_set_replicated");
        return "ok 0";
      }
      if (cmd == "offload") return offload_now();
      if (cmd == "reload") return timed([] { check(tagmem_reload(kTag, 1, 0), "reload"); });
      if (cmd == "mapped") return "ok 0 " + std::to_string(tag_stats(kTag[0]).mapped_bytes);
      if (cmd == "settle") {  // until its offload's waiter has unmapped everything (10 s at most)
        const auto t0 = clock::now();
        while (tag_stats(kTag[0]).mapped_bytes != 0 && seconds_since(t0) < 10) usleep(200);
        return "ok " + std::to_string(seconds_since(t0)) + " " +
               std::to_string(tag_stats(kTag[0]).mapped_bytes);
      }
      if (cmd == "mem") {
        return "ok 0 " + std::to_string(proc_bytes("/proc/self/status", "RssShmem")) + " " +
               std::to_string(proc_bytes("/proc/self/status", "VmRSS"));
      }
      if (cmd == "verify") {
        const std::string who = "replicated (replica " + std::to_string(rank) + ")";
        return verify(e, d, who, ++round, false) ? "ok 0" : "fail bytes differ";
      }
      return {};
    });
  } catch (const std::exception& ex) {
    reply_line(out, std::string("fail ") + ex.what());
    return 1;
  }
  return 0;
}

void run_replicated(env& e, const std::vector<std::string>& child_args, int gpus) {
  const char* name = "replicated";
  const double bytes = double(sum(replica_sizes(e.opt.scale)));
  char dir[] = "/tmp/tagmem-bench-replicas-XXXXXX";
  if (!mkdtemp(dir)) throw std::runtime_error("mkdtemp failed");
  setenv("TAGMEM_JOB", ("bench-replicated-" + std::to_string(getpid())).c_str(), 1);
  setenv("TAGMEM_PEER_DIR", dir, 1);
  child c[2] = {{"replica 0"}, {"replica 1"}};
  auto cleanup = [&] {
    for (child& x : c) {
      try {
        finish(x);
      } catch (...) {
      }
    }
    unsetenv("TAGMEM_JOB");
    unsetenv("TAGMEM_PEER_DIR");
    rmdir(dir);  // emptied by the children's sessions
  };
  try {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> a = {"tagmem_bench_offload", "--replica-role=" + std::to_string(r)};
      a.insert(a.end(), child_args.begin(), child_args.end());
      if (gpus == 2) setenv("CUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1);
      c[r] = spawn(c[r].who, a);
    }
    if (gpus == 2) unsetenv("CUDA_VISIBLE_DEVICES");
    double mapped = 0;  // what the shares cover: the tag's mappings
    for (child& x : c) mapped = ask_full(x.to, x.from, x.who, "fill").a;
    e.out.add(name, "tag, in each of 2 processes",
              gib(bytes) + (gpus == 2 ? ", one GPU each" : ", both on device 0"));

    const answer alone = ask_full(c[0].to, c[0].from, c[0].who, "plain");
    e.out.add(name, "plain BACKUP offload, one process alone",
              fixed(alone.seconds * 1e3, 1) + " ms",
              fixed(bytes / alone.seconds / 1e9, 1) + " GB/s, moved " + gib(alone.a));
    const auto both_plain = ask_both(c[0], "plain", c[1], "plain");
    const double plain_both = std::max(both_plain.first.seconds, both_plain.second.seconds);
    e.out.add(name, "plain BACKUP offload, both processes at once",
              fixed(plain_both * 1e3, 1) + " ms",
              "moved " + gib(both_plain.first.a + both_plain.second.a));

    for (child& x : c) ask(x.to, x.from, x.who, "replicate");
    auto verified = [&] {  // every byte of both children
      bool ok = true;
      for (child& x : c) {
        try {
          ask(x.to, x.from, x.who, "verify");
        } catch (const std::exception& ex) {
          std::printf("[%s] %s\n", name, ex.what());
          ok = false;
        }
      }
      return ok;
    };
    const int cycles = std::max(2, e.opt.cycles);
    for (int cycle = 1; cycle <= cycles; ++cycle) {
      const double shmem0 = proc_bytes("/proc/meminfo", "Shmem");
      const double avail0 = proc_bytes("/proc/meminfo", "MemAvailable");
      const auto off = ask_both(c[0], "offload", c[1], "offload");
      const double shmem1 = proc_bytes("/proc/meminfo", "Shmem");
      const double avail1 = proc_bytes("/proc/meminfo", "MemAvailable");
      const answer m0 = ask_full(c[0].to, c[0].from, c[0].who, "mem");
      const answer m1 = ask_full(c[1].to, c[1].from, c[1].who, "mem");
      const auto rel = ask_both(c[0], "reload", c[1], "reload");
      const bool ok = verified();
      e.ok = e.ok && ok;
      if (cycle != 1 && cycle != cycles) continue;
      const std::string at = cycle == 1 ? "cycle 1: " : "last cycle: ";
      const double took = std::max(off.first.seconds, off.second.seconds);
      e.out.add(
          name, at + "offload, per process",
          fixed(off.first.seconds * 1e3, 1) + " / " + fixed(off.second.seconds * 1e3, 1) + " ms",
          fixed(took / alone.seconds, 3) + "x the plain offload alone, " +
              fixed(took / plain_both, 3) + "x both plain at once");
      e.out.add(
          name, at + "bytes moved by each offload", gib(off.first.a) + " / " + gib(off.second.a),
          fixed((off.first.a + off.second.a) / mapped, 3) + " of the tag's mapped bytes in all");
      e.out.add(name, at + "host copy (tag host_bytes, each)",
                gib(off.first.b) + " / " + gib(off.second.b));
      e.out.add(name, at + "machine: Shmem / MemAvailable while offloaded",
                signed_gib(shmem1 - shmem0) + " / " + signed_gib(avail1 - avail0));
      e.out.add(name, at + "processes: RssShmem / VmRSS while offloaded",
                gib(m0.a) + ", " + gib(m1.a) + " / " + gib(m0.b) + ", " + gib(m1.b),
                "the same shared pages, counted in each");
      e.out.add(
          name, at + "reload, per process (each copies the whole tag)",
          fixed(rel.first.seconds * 1e3, 1) + " / " + fixed(rel.second.seconds * 1e3, 1) + " ms");
      e.out.add(name, at + "every byte after reload", ok ? "verified in both" : "FAILED");
    }
    for (int cycle = 1; cycle <= cycles; ++cycle) {  // step 3
      const answer first = ask_full(c[0].to, c[0].from, c[0].who, "offload");
      const answer waiting = ask_full(c[0].to, c[0].from, c[0].who, "mapped");
      const answer second = ask_full(c[1].to, c[1].from, c[1].who, "offload");
      const answer settled = ask_full(c[0].to, c[0].from, c[0].who, "settle");
      ask_both(c[0], "reload", c[1], "reload");
      bool ok = verified();
      if (settled.a != 0) {
        std::printf("[%s] child 0 still maps %.0f bytes\n", name, settled.a);
        ok = false;
      }
      e.ok = e.ok && ok;
      if (cycle != cycles) continue;
      const std::string at = "one after the other, last cycle: ";
      e.out.add(name, at + "offload of child 0, then of child 1",
                fixed(first.seconds * 1e3, 1) + " / " + fixed(second.seconds * 1e3, 1) + " ms",
                fixed(first.seconds / alone.seconds, 3) + "x / " +
                    fixed(second.seconds / alone.seconds, 3) + "x the plain offload alone");
      e.out.add(name, at + "bytes moved by each offload", gib(first.a) + " / " + gib(second.a),
                fixed((first.a + second.a) / mapped, 3) + " of the tag's mapped bytes in all");
      e.out.add(name, at + "child 0 still mapped when its offload returned", gib(waiting.a),
                "unmapped " + fixed(settled.seconds * 1e3, 1) + " ms after child 1's offload");
      e.out.add(name, at + "host copy (tag host_bytes, each)",
                gib(first.b) + " / " + gib(second.b));
      e.out.add(name, at + "every byte after reload", ok ? "verified in both" : "FAILED");
    }
    std::printf("[%s] %s\n", name, e.ok ? "PASS" : "FAIL");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
}

}  // namespace tagmem::bench
