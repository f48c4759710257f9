// scenario_kv.cpp — a KV cache offloaded in DISCARD mode and reloaded: nothing is copied, so
// the times are those of unmapping/releasing and creating/mapping/granting access (target
// 10 ms each for 60 GiB on the H200).
//
// The cache is 64 tensors (a K and a V per layer of a 32-layer model), each its own segment.
// After every reload a window at both ends of every tensor is written and read back: the memory
// must be mapped and writable again; its old contents are undefined in DISCARD mode.
#include <cstdio>
#include <cstring>

#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

// Writes and reads back a window at each end of each tensor; returns the windows that failed.
int check_windows(const std::vector<CUdeviceptr>& ptrs, std::size_t bytes, const pattern& pat,
                  int cycle) {
  use_device0();
  const std::size_t w = std::min<std::size_t>(64u << 10, bytes);
  std::vector<unsigned char> got(w);
  int bad = 0;
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    for (std::size_t off : {std::size_t(0), bytes - w}) {
      const unsigned char* want = pat.data() + (mix(i * 7 + cycle) % (pat.size() - w));
      BENCH_CU(cuMemcpyHtoD, ptrs[i] + off, want, w);
      BENCH_CU(cuMemcpyDtoH, got.data(), ptrs[i] + off, w);
      bad += std::memcmp(got.data(), want, w) != 0;
    }
  }
  return bad;
}

}  // namespace

void run_kv_cache(env& e) {
  session s;
  const char* tag = "kv_cache";
  const std::size_t per =
      std::max<std::size_t>(2u << 20, e.opt.kv_bytes / 64 / (2u << 20) * (2u << 20));
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 64; ++i) {
    void* p = nullptr;
    check(tagmem_malloc_tagged(&p, per, tag, 0, nullptr), "tagmem_malloc_tagged (kv_cache)");
    ptrs.push_back(reinterpret_cast<CUdeviceptr>(p));
  }
  const std::size_t total = per * ptrs.size();
  const char* tags[] = {tag};
  std::vector<double> off, rel;
  std::size_t freed = 0;
  int bad = 0;
  for (int c = 1; c <= e.opt.cycles; ++c) {
    sync_device();
    std::size_t free_before = device_stats().device_free_bytes;
    auto t0 = clock::now();
    check(tagmem_offload(tags, 1, 0, TAGMEM_DISCARD), "tagmem_offload (discard)");
    off.push_back(seconds_since(t0));
    freed = device_stats().device_free_bytes - free_before;
    t0 = clock::now();
    check(tagmem_reload(tags, 1, 0), "tagmem_reload");
    rel.push_back(seconds_since(t0));
    int b = check_windows(ptrs, per, e.pat, c);
    bad += b;
    std::printf(
        "[kv cache] cycle %d: offload %.2f ms (freed %.2f GB), reload %.2f ms, windows %s\n", c,
        off.back() * 1e3, freed / 1e9, rel.back() * 1e3, b ? "WRONG" : "ok");
  }
  for (CUdeviceptr p : ptrs) tagmem_free(reinterpret_cast<void*>(p), nullptr);
  if (bad) e.ok = false;
  std::vector<double> off_ss(off.begin() + 1, off.end()), rel_ss(rel.begin() + 1, rel.end());
  const std::string name = "kv cache (discard)";
  e.out.add(name, "bytes / tensors", format_bytes(total) + " / 64",
            "device memory freed by offload: " + fixed(freed / 1e9, 2) + " GB");
  e.out.add(name, "offload ms cycle 1 / steady median",
            fixed(off[0] * 1e3, 2) + " / " + fixed(median(off_ss) * 1e3, 2),
            "target <= 10 ms for 60 GiB");
  e.out.add(name, "reload ms cycle 1 / steady median",
            fixed(rel[0] * 1e3, 2) + " / " + fixed(median(rel_ss) * 1e3, 2),
            "target <= 10 ms for 60 GiB");
  e.out.add(name, "windows written and read back after reload",
            bad ? std::to_string(bad) + " WRONG" : "all ok");
}

}  // namespace tagmem::bench
