// pinning_bench.cpp — how should the host store pin memory? Pins --bytes (default 4 GiB) each
// way below, reports the time to pin and to unpin, and the copy rate into and out of the pinned
// memory (a method that pins fast but copies slowly loses). Feeds Note [pinning method].
//
//   tagmem_bench_pinning [--bytes=4G] [--threads=1,4,8,16] [--tsv=pinning.tsv]
//
// Methods: cuMemHostAlloc in one call and in pieces on T threads; mmap + cuMemHostRegister with
// the driver faulting the pages in, with one thread touching them first, with T threads touching
// (huge-page advice) and one register; tagmem's own path (pieces of mmap + touch + register,
// T at a time, huge-page advice or not: host_pinning.cpp); and host-located cuMem
// (cuMemCreate on the host NUMA node + map + access for device and host).
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench_support.hpp"
#include "host/host_pinning.hpp"

using namespace tagmem;
using namespace tagmem::bench;

namespace {

struct pinned_set {
  std::vector<pinned_slab> ranges;
  std::function<void()> unpin;
};

char* map_plain(std::size_t n, bool huge) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  if (huge) madvise(p, n, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

void touch(char* p, std::size_t n, unsigned threads) {
  std::vector<std::thread> pool;
  std::size_t per = (n / threads + 4095) / 4096 * 4096;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      for (std::size_t off = t * per; off < std::min(n, (t + 1) * per); off += 4096) p[off] = 1;
    });
  }
  for (auto& th : pool) th.join();
}

pinned_set register_one(std::size_t n, bool huge, unsigned touch_threads) {
  char* p = map_plain(n, huge);
  if (touch_threads) touch(p, n, touch_threads);
  BENCH_CU(cuMemHostRegister, p, n, CU_MEMHOSTREGISTER_PORTABLE);
  return {{{p, n}}, [p, n] {
            cu().cuMemHostUnregister(p);
            munmap(p, n);
          }};
}

pinned_set tagmem_path(std::size_t n, unsigned threads, pin_method how, CUcontext ctx) {
  auto set = std::make_shared<std::vector<pinned_slab>>();
  std::mutex m;
  try {
    pin_parallel(n, 256u << 20, threads, how, ctx, [&](pinned_slab r) {
      std::lock_guard lock(m);
      set->push_back(r);
    });
  } catch (...) {
    unpin_parallel(set->data(), set->size(), threads, how, ctx);
    throw;
  }
  return {*set, [set, threads, how, ctx] {
            unpin_parallel(set->data(), set->size(), threads, how, ctx);
          }};
}

pinned_set host_cumem(std::size_t n) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  std::size_t gran = 0;
  BENCH_CU(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  n = (n + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h = 0;
  BENCH_CU(cuMemCreate, &h, n, &prop, 0);
  CUdeviceptr va = 0;
  BENCH_CU(cuMemAddressReserve, &va, n, gran, 0, 0);
  BENCH_CU(cuMemMap, va, n, 0, h, 0);
  CUmemAccessDesc d[2] = {};
  d[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d[0].location.id = 0;
  d[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  d[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  d[1].location.id = 0;
  d[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  BENCH_CU(cuMemSetAccess, va, n, d, 2);
  return {{{reinterpret_cast<char*>(va), n}}, [va, n, h] {
            cu().cuMemUnmap(va, n);
            cu().cuMemRelease(h);
            cu().cuMemAddressFree(va, n);
          }};
}

// The ranges of `set`, as copy_rate measures through them.
std::vector<host_range> ranges_of(const pinned_set& set) {
  std::vector<host_range> out;
  for (const pinned_slab& r : set.ranges) out.push_back({r.base, r.size});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  args a(argc, argv, {"bytes", "threads", "tsv"});
  if (!a.ok()) {
    std::fprintf(stderr, "tagmem_bench_pinning: %s\n", a.error().c_str());
    return 2;
  }
  std::size_t n = 0;
  std::vector<unsigned> threads;
  try {
    n = (a.bytes("bytes", 4ull << 30) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    std::stringstream ss(a.str("threads", "1,4,8,16"));
    for (std::string t; std::getline(ss, t, ',');) threads.push_back(std::max(1, std::stoi(t)));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "tagmem_bench_pinning: bad option: %s\n", ex.what());
    return 2;
  }
  results out;
  bool ok = true;
  try {
    CUcontext ctx = use_device0();
    std::printf("# pinning %s on the %s driver, %u hardware threads\n", format_bytes(n).c_str(),
                using_emulator() ? "EMULATED" : "real CUDA", std::thread::hardware_concurrency());
    const std::size_t dev_bytes = std::min<std::size_t>(n, 256u << 20);
    CUdeviceptr dev = 0;
    BENCH_CU(cuMemAlloc, &dev, dev_bytes);
    CUstream s = nullptr;
    BENCH_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
    unsigned tmax = threads.empty() ? 1 : *std::max_element(threads.begin(), threads.end());
    struct variant {
      std::string name;
      std::function<pinned_set()> pin;
    };
    std::vector<variant> variants = {
        {"cuMemHostAlloc, 1 call", [&] { return tagmem_path(n, 1, pin_method::host_alloc, ctx); }},
        {"mmap + cuMemHostRegister (driver faults pages)",
         [&] { return register_one(n, false, 0); }},
        {"mmap + touch 1 thread + register", [&] { return register_one(n, false, 1); }},
        {"mmap + THP + touch " + std::to_string(tmax) + " threads + 1 register",
         [&] { return register_one(n, true, tmax); }},
        {"host cuMem (HOST_NUMA create + map + access)", [&] { return host_cumem(n); }},
    };
    for (unsigned t : threads) {
      variants.push_back({"tagmem register (THP) x" + std::to_string(t) + " threads",
                          [&, t] { return tagmem_path(n, t, pin_method::register_huge, ctx); }});
      if (t == 1) continue;  // that is "cuMemHostAlloc, 1 call"
      variants.push_back({"tagmem host_alloc pieces x" + std::to_string(t) + " threads",
                          [&, t] { return tagmem_path(n, t, pin_method::host_alloc, ctx); }});
    }
    variants.push_back({"tagmem register_small (no THP) x" + std::to_string(tmax) + " threads",
                        [&] { return tagmem_path(n, tmax, pin_method::register_small, ctx); }});
    for (const variant& v : variants) {
      try {
        auto t0 = clock::now();
        pinned_set set = v.pin();
        double pin_s = seconds_since(t0);
        double d2h = copy_rate(ranges_of(set), dev, dev_bytes, true, s);
        double h2d = copy_rate(ranges_of(set), dev, dev_bytes, false, s);
        t0 = clock::now();
        set.unpin();
        double unpin_s = seconds_since(t0);
        out.add(v.name, "pin s / GB/s", fixed(pin_s, 3) + " / " + fixed(n / pin_s / 1e9, 2),
                "unpin " + fixed(unpin_s, 3) + " s; copies D2H " + fixed(d2h, 1) + ", H2D " +
                    fixed(h2d, 1) + " GB/s");
        std::printf("[pinning] %s: pin %.3f s, unpin %.3f s, D2H %.1f GB/s, H2D %.1f GB/s\n",
                    v.name.c_str(), pin_s, unpin_s, d2h, h2d);
        std::fflush(stdout);
      } catch (const std::exception& ex) {
        out.add(v.name, "pin s / GB/s", "n/a", std::string("failed: ") + ex.what());
      }
    }
    cu().cuStreamDestroy(s);
    cu().cuMemFree(dev);
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  out.print("pinning " + format_bytes(n));
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
