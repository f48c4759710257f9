// vmm_bench.cpp — what one physical mapping costs, by size: cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease per chunk, for chunk sizes from 2 MiB up to the
// total. Decides chunk_bytes and max_mapping_bytes (Note [reload coalescing]) and whether
// unmapping or mapping on several threads pays, and whether releasing costs the same when the
// memory was never mapped. Also probes two driver behaviours tagmem could use: one
// cuMemSetAccess over many adjacent mappings, and one cuMemUnmap over many.
//
//   tagmem_bench_vmm [--bytes=8G] [--sizes=2M,20M,64M,512M,1G,4G] [--threads=4] [--tsv=vmm.tsv]
#include <cstdio>
#include <functional>
#include <sstream>
#include <thread>

#include "bench_support.hpp"

using namespace tagmem::bench;

namespace {

struct chunked {
  CUdeviceptr va = 0;
  std::size_t chunk = 0, count = 0;
  std::vector<CUmemGenericAllocationHandle> h;
};

double timed(const std::function<void()>& f) {
  auto t0 = clock::now();
  f();
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  args a(argc, argv, {"bytes", "sizes", "threads", "tsv"});
  if (!a.ok()) {
    std::fprintf(stderr, "tagmem_bench_vmm: %s\n", a.error().c_str());
    return 2;
  }
  std::size_t total = 0;
  std::vector<std::size_t> sizes;
  unsigned threads = 4;
  try {
    total = a.bytes("bytes", 8ull << 30);
    std::stringstream ss(a.str("sizes", "2M,20M,64M,512M,1G,4G"));
    for (std::string t; std::getline(ss, t, ',');) sizes.push_back(parse_bytes(t));
    threads = std::max(1, int(a.num("threads", 4)));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "tagmem_bench_vmm: bad option: %s\n", ex.what());
    return 2;
  }
  results out;
  bool ok = true;
  try {
    use_device0();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::size_t gran = 0;
    BENCH_CU(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    std::printf("# vmm costs over %s on the %s driver, granularity %zu\n",
                format_bytes(total).c_str(), using_emulator() ? "EMULATED" : "real CUDA", gran);
    for (std::size_t chunk : sizes) {
      chunk = (chunk + gran - 1) / gran * gran;
      if (chunk > total) continue;
      chunked c;
      c.chunk = chunk;
      c.count = total / chunk;
      c.h.resize(c.count);
      const std::size_t span = c.count * chunk;
      BENCH_CU(cuMemAddressReserve, &c.va, span, gran, 0, 0);
      auto create = [&] {
        for (auto& h : c.h) BENCH_CU(cuMemCreate, &h, chunk, &prop, 0);
      };
      auto map = [&] {
        for (std::size_t i = 0; i < c.count; ++i)
          BENCH_CU(cuMemMap, c.va + i * chunk, chunk, 0, c.h[i], 0);
      };
      auto set_access = [&] {
        for (std::size_t i = 0; i < c.count; ++i)
          BENCH_CU(cuMemSetAccess, c.va + i * chunk, chunk, &access, 1);
      };
      auto unmap = [&] {
        for (std::size_t i = 0; i < c.count; ++i) BENCH_CU(cuMemUnmap, c.va + i * chunk, chunk);
      };
      auto release = [&] {
        for (auto h : c.h) BENCH_CU(cuMemRelease, h);
      };
      // Pass 1: each step per chunk.
      double t_create = timed(create), t_map = timed(map), t_access = timed(set_access);
      double t_unmap = timed(unmap), t_release = timed(release);
      // Pass 2: one access call over every chunk, then one unmap call over every chunk.
      create();
      map();
      double t_access_one = timed([&] { BENCH_CU(cuMemSetAccess, c.va, span, &access, 1); });
      CUresult unmap_one = CUDA_SUCCESS;
      double t_unmap_one = timed([&] { unmap_one = cu().cuMemUnmap(c.va, span); });
      if (unmap_one != CUDA_SUCCESS) unmap();
      release();
      // Pass 3: unmap + release spread over threads.
      create();
      map();
      set_access();
      double t_unmap_threads = timed([&] {
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            for (std::size_t i = t; i < c.count; i += threads) {
              cu().cuMemUnmap(c.va + i * chunk, chunk);
              cu().cuMemRelease(c.h[i]);
            }
          });
        }
        for (auto& th : pool) th.join();
      });
      // Pass 4: the map side spread over threads (create+map+access of whole chunks).
      double t_map_threads = timed([&] {
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            for (std::size_t i = t; i < c.count; i += threads) {
              cu().cuMemCreate(&c.h[i], chunk, &prop, 0);
              cu().cuMemMap(c.va + i * chunk, chunk, 0, c.h[i], 0);
              cu().cuMemSetAccess(c.va + i * chunk, chunk, &access, 1);
            }
          });
        }
        for (auto& th : pool) th.join();
      });
      unmap();
      release();
      // Pass 5: create then release, never mapped: is the release cost the driver scrubbing the
      // memory it gets back (linear in bytes whatever happened to it)?
      double t_create_unmapped = timed(create), t_release_unmapped = timed(release);
      BENCH_CU(cuMemAddressFree, c.va, span);
      auto us = [&](double s) { return fixed(s / c.count * 1e6, 1); };
      std::string label =
          "chunk " + std::to_string(chunk >> 20) + " MiB x " + std::to_string(c.count);
      out.add(label, "us per chunk: create/map/access/unmap/release",
              us(t_create) + "/" + us(t_map) + "/" + us(t_access) + "/" + us(t_unmap) + "/" +
                  us(t_release));
      out.add(label, "ms all: map side (create+map+access) / unmap side (unmap+release)",
              fixed((t_create + t_map + t_access) * 1e3, 2) + " / " +
                  fixed((t_unmap + t_release) * 1e3, 2));
      out.add(label, "ms one access over all / per chunk",
              fixed(t_access_one * 1e3, 3) + " / " + fixed(t_access * 1e3, 3));
      out.add(label, "one cuMemUnmap over all chunks",
              unmap_one == CUDA_SUCCESS ? "ok, " + fixed(t_unmap_one * 1e3, 3) + " ms"
                                        : "refused: " + tagmem::driver::describe(unmap_one));
      out.add(label, "ms unmap+release: 1 thread / " + std::to_string(threads) + " threads",
              fixed((t_unmap + t_release) * 1e3, 2) + " / " + fixed(t_unmap_threads * 1e3, 2));
      out.add(
          label, "ms map side: 1 thread / " + std::to_string(threads) + " threads",
          fixed((t_create + t_map + t_access) * 1e3, 2) + " / " + fixed(t_map_threads * 1e3, 2));
      out.add(label, "us per chunk never mapped: create / release",
              us(t_create_unmapped) + " / " + us(t_release_unmapped));
      std::printf("[vmm] %s done\n", label.c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  out.print("vmm costs per mapping");
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
