// raw_link.cpp — the ceiling: pinned host <-> device copies with nothing of tagmem in the way.
//
// One device buffer from cuMemAlloc and one pinned host buffer per direction, each of
// link_bytes. Measured: one copy of the whole buffer, the same in 64 MiB pieces over two
// streams (how tagmem copies), and both directions at once. Each is run once to warm up, then
// five times; the median counts. The best of "one copy" and "pieces" is the ceiling the other
// scenarios are compared with.
#include <cstdio>
#include <functional>

#include "scenarios.hpp"

namespace tagmem::bench {

link_speed run_raw_link(env& e) {
  use_device0();
  const std::size_t n = e.opt.link_bytes;
  const std::size_t piece = std::min<std::size_t>(64u << 20, n);
  CUdeviceptr d1 = 0, d2 = 0;
  BENCH_CU(cuMemAlloc, &d1, n);
  BENCH_CU(cuMemAlloc, &d2, n);
  CUstream s[2] = {nullptr, nullptr};
  BENCH_CU(cuStreamCreate, &s[0], CU_STREAM_NON_BLOCKING);
  BENCH_CU(cuStreamCreate, &s[1], CU_STREAM_NON_BLOCKING);
  link_speed out;
  {
    pinned_buffer h1(n), h2(n);
    fill_random(h1.data(), n, 1);
    fill_random(h2.data(), n, 2);
    auto sync = [&] {
      BENCH_CU(cuStreamSynchronize, s[0]);
      BENCH_CU(cuStreamSynchronize, s[1]);
    };
    // Median GB/s of `moved` bytes over 5 runs after a warm-up.
    auto rate = [&](std::size_t moved, const std::function<void()>& queue) {
      queue();
      sync();
      std::vector<double> t;
      for (int i = 0; i < 5; ++i) {
        auto t0 = clock::now();
        queue();
        sync();
        t.push_back(seconds_since(t0));
      }
      return moved / median(t) / 1e9;
    };
    auto pieces = [&](bool to_device) {
      std::size_t k = 0;
      for (std::size_t off = 0; off < n; off += piece, ++k) {
        std::size_t len = std::min(piece, n - off);
        if (to_device) {
          BENCH_CU(cuMemcpyHtoDAsync, d1 + off, h1.data() + off, len, s[k % 2]);
        } else {
          BENCH_CU(cuMemcpyDtoHAsync, h1.data() + off, d1 + off, len, s[k % 2]);
        }
      }
    };
    double h2d_one = rate(n, [&] { BENCH_CU(cuMemcpyHtoDAsync, d1, h1.data(), n, s[0]); });
    double d2h_one = rate(n, [&] { BENCH_CU(cuMemcpyDtoHAsync, h1.data(), d1, n, s[0]); });
    double h2d_pieces = rate(n, [&] { pieces(true); });
    double d2h_pieces = rate(n, [&] { pieces(false); });
    double bidir = rate(2 * n, [&] {
      BENCH_CU(cuMemcpyHtoDAsync, d1, h1.data(), n, s[0]);
      BENCH_CU(cuMemcpyDtoHAsync, h2.data(), d2, n, s[1]);
    });
    out = {std::max(h2d_one, h2d_pieces), std::max(d2h_one, d2h_pieces), bidir};
    std::string what = format_bytes(n) + " pinned";
    e.out.add("raw link", "H2D GB/s (one copy)", fixed(h2d_one, 2), what);
    e.out.add("raw link", "H2D GB/s (64 MiB pieces, 2 streams)", fixed(h2d_pieces, 2));
    e.out.add("raw link", "D2H GB/s (one copy)", fixed(d2h_one, 2));
    e.out.add("raw link", "D2H GB/s (64 MiB pieces, 2 streams)", fixed(d2h_pieces, 2));
    e.out.add("raw link", "bidirectional GB/s (H2D + D2H at once)", fixed(bidir, 2),
              fixed(bidir / (out.h2d + out.d2h), 2) + " of H2D + D2H");
    e.out.add("raw link", "ceiling GB/s H2D,D2H,bidir",
              fixed(out.h2d, 2) + "," + fixed(out.d2h, 2) + "," + fixed(out.bidir, 2),
              "what the ratios below divide by (--link= reuses it)");
  }
  cu().cuStreamDestroy(s[0]);
  cu().cuStreamDestroy(s[1]);
  cu().cuMemFree(d1);
  cu().cuMemFree(d2);
  return out;
}

}  // namespace tagmem::bench
