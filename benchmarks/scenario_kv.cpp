// scenario_kv.cpp — a KV cache offloaded in DISCARD mode and reloaded: nothing is copied, so
// the times are those of unmapping/releasing and creating/mapping/granting access (target:
// 10 ms each for 60 GiB). Runs tagmem's default (release in the background) and the
// release-before-return mode side by side.
//
// The cache is 64 tensors (a K and a V per layer of a 32-layer model), each its own segment.
// After every reload a window at both ends of every tensor is written and read back: the memory
// must be mapped and writable again; its old contents are undefined in DISCARD mode.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

struct kv_times {
  std::vector<double> off, released, rel;  // seconds per cycle
  std::size_t freed = 0;                   // bytes, last cycle
  int bad = 0;
};

// `cycles` DISCARD offload/reload cycles of 64 tensors of `per` bytes in a fresh tagmem. The
// offload is timed to its return and again to tagmem_wait_released (every byte back with the
// driver); the reload starts after that, so the two do not share the driver.
kv_times run_cycles(env& e, std::size_t per, const char* label) {
  session s;
  const char* tag = "kv_cache";
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 64; ++i) {
    void* p = nullptr;
    check(tagmem_malloc_tagged(&p, per, tag, 0, nullptr), "tagmem_malloc_tagged (kv_cache)");
    ptrs.push_back(reinterpret_cast<CUdeviceptr>(p));
  }
  const char* tags[] = {tag};
  kv_times t;
  for (int c = 1; c <= e.opt.cycles; ++c) {
    sync_device();
    std::size_t free_before = device_stats().device_free_bytes;
    auto t0 = clock::now();
    check(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD), "tagmem_offload (discard)");
    t.off.push_back(seconds_since(t0));
    check(tagmem_wait_released(0), "tagmem_wait_released");
    t.released.push_back(seconds_since(t0));
    t.freed = device_stats().device_free_bytes - free_before;
    t0 = clock::now();
    check(tagmem_reload(tags, 1, 0), "tagmem_reload");
    t.rel.push_back(seconds_since(t0));
    int b = check_windows(ptrs, per, e.pat, c);
    t.bad += b;
    std::printf(
        "[kv cache, %s] cycle %d: offload %.2f ms, memory back after %.2f ms (freed %.2f GB), "
        "reload %.2f ms, windows %s\n",
        label, c, t.off.back() * 1e3, t.released.back() * 1e3, t.freed / 1e9, t.rel.back() * 1e3,
        b ? "WRONG" : "ok");
  }
  for (CUdeviceptr p : ptrs) tagmem_free(reinterpret_cast<void*>(p), nullptr);
  return t;
}

std::string first_and_steady(const std::vector<double>& v) {
  std::vector<double> steady(v.begin() + 1, v.end());
  return fixed(v[0] * 1e3, 2) + " / " + fixed(median(steady) * 1e3, 2);
}

}  // namespace

// Runs tagmem's default (DISCARD releases in the background, Note [background release]) and, as
// the baseline, TAGMEM_DISCARD_RELEASE=wait (released before the offload returns).
void run_kv_cache(env& e) {
  const std::size_t per =
      std::max<std::size_t>(2u << 20, e.opt.kv_bytes / 64 / (2u << 20) * (2u << 20));
  const char* user = std::getenv("TAGMEM_DISCARD_RELEASE");
  const std::string saved = user ? user : "";
  setenv("TAGMEM_DISCARD_RELEASE", "background", 1);
  kv_times bg = run_cycles(e, per, "background release");
  setenv("TAGMEM_DISCARD_RELEASE", "wait", 1);
  kv_times wait = run_cycles(e, per, "release before return");
  if (user) {
    setenv("TAGMEM_DISCARD_RELEASE", saved.c_str(), 1);
  } else {
    unsetenv("TAGMEM_DISCARD_RELEASE");
  }
  if (bg.bad || wait.bad) e.ok = false;
  const std::string name = "kv cache (discard)";
  e.out.add(name, "bytes / tensors", format_bytes(per * 64) + " / 64",
            "device memory freed by offload: " + fixed(bg.freed / 1e9, 2) + " GB");
  e.out.add(name, "offload ms cycle 1 / steady median", first_and_steady(bg.off),
            "target <= 10 ms for 60 GiB; returns once unmapped, released in the background");
  e.out.add(name, "offload until memory back ms cycle 1 / steady", first_and_steady(bg.released),
            "tagmem_offload + tagmem_wait_released");
  e.out.add(name, "reload ms cycle 1 / steady median", first_and_steady(bg.rel),
            "target <= 10 ms for 60 GiB");
  e.out.add(name, "baseline TAGMEM_DISCARD_RELEASE=wait: offload ms c1 / steady",
            first_and_steady(wait.off), "released before returning");
  e.out.add(name, "baseline TAGMEM_DISCARD_RELEASE=wait: reload ms c1 / steady",
            first_and_steady(wait.rel), "");
  e.out.add(name, "windows written and read back after reload",
            bg.bad + wait.bad ? std::to_string(bg.bad + wait.bad) + " WRONG" : "all ok");
}

}  // namespace tagmem::bench
