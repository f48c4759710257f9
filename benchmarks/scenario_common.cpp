// scenario_common.cpp — shapes, the tagmem session and verification shared by the scenarios.
//
// Note [verify can fail]: a check that cannot fail proves nothing. The first verification of
// every scenario therefore first flips one device byte at a random place and requires the full
// comparison to report exactly that byte, then puts it back and verifies for real.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "scenarios.hpp"

namespace tagmem::bench {

std::vector<std::size_t> weights_sizes(double scale) {
  auto t = [&](std::size_t rows, std::size_t cols) {
    double elems = std::ceil(double(rows) * double(cols) * scale / 128.0) * 128.0;
    return std::max<std::size_t>(256, static_cast<std::size_t>(elems) * 2);  // bf16
  };
  std::vector<std::size_t> s;
  s.push_back(t(128256, 4096));  // embedding
  for (int layer = 0; layer < 32; ++layer) {
    s.push_back(t(4096, 1));      // input norm
    s.push_back(t(4096, 4096));   // q
    s.push_back(t(1024, 4096));   // k
    s.push_back(t(1024, 4096));   // v
    s.push_back(t(4096, 4096));   // o
    s.push_back(t(4096, 1));      // post-attention norm
    s.push_back(t(14336, 4096));  // gate
    s.push_back(t(14336, 4096));  // up
    s.push_back(t(4096, 14336));  // down
  }
  s.push_back(t(4096, 1));       // final norm
  s.push_back(t(128256, 4096));  // LM head
  return s;
}

std::vector<std::size_t> many_small_sizes(std::size_t total, std::size_t count) {
  // Log-uniform over a factor of 24 around the mean, then scaled to the total: a mix of what
  // the pool packs into 2 MiB chunks and into 20 MiB segments.
  std::vector<double> w(count);
  double sum_w = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double u = double(mix(i + 777) >> 11) / double(1ull << 53);
    w[i] = std::exp2(-2.0 + 4.58 * u);
    sum_w += w[i];
  }
  std::vector<std::size_t> s(count);
  for (std::size_t i = 0; i < count; ++i) {
    double bytes = double(total) * w[i] / sum_w;
    s[i] = std::max<std::size_t>(256, static_cast<std::size_t>(bytes / 256.0) * 256);
  }
  return s;
}

std::size_t sum(const std::vector<std::size_t>& sizes) {
  std::size_t n = 0;
  for (std::size_t v : sizes) n += v;
  return n;
}

void check(int status, const char* what) {
  if (status == TAGMEM_SUCCESS) return;
  throw std::runtime_error(std::string(what) + ": " +
                           tagmem_status_string(static_cast<tagmem_status>(status)) + ": " +
                           tagmem_last_error());
}

session::session() { check(tagmem_init(nullptr), "tagmem_init"); }
session::~session() { tagmem_shutdown(); }

tagmem_tag_stats tag_stats(const char* tag) {
  tagmem_tag_stats s{};
  check(tagmem_tag_stats_get(tag, 0, &s), "tagmem_tag_stats_get");
  return s;
}

tagmem_device_stats device_stats() {
  tagmem_device_stats s{};
  check(tagmem_device_stats_get(0, &s), "tagmem_device_stats_get");
  return s;
}

void sync_device() {
  BENCH_CU(cuCtxSynchronize, use_device0());  // cuCtxSynchronize_v2 (entry_points.def)
}

bool verify(env& e, dataset& d, const std::string& scenario, int cycle, bool prove_failure) {
  bool ok = true;
  if (prove_failure) {  // Note [verify can fail]
    d.corrupt_one_byte(e.pat, 0x5eed + cycle);
    verify_report bad = d.verify(e.pat);
    d.restore_byte(e.pat);
    std::string where = "tensor " + std::to_string(d.corrupted_tensor()) + " offset " +
                        std::to_string(d.corrupted_offset());
    if (bad.bad_bytes != 1 || bad.first_bad.rfind(where, 0) != 0) {
      std::printf(
          "[%s] VERIFY SELF-CHECK FAILED: one byte flipped at %s, the check reported %llu "
          "bad bytes (%s)\n",
          scenario.c_str(), where.c_str(), (unsigned long long)bad.bad_bytes,
          bad.first_bad.c_str());
      ok = false;
    } else {
      std::printf("[%s] verify self-check: the flipped byte at %s was found\n", scenario.c_str(),
                  where.c_str());
    }
  }
  verify_report rep = d.verify(e.pat);
  if (!rep.ok()) {
    std::printf(
        "[%s] cycle %d: VERIFY FAILED for tag %s: %llu of %llu bytes wrong, %llu of %llu "
        "samples wrong; first at %s\n",
        scenario.c_str(), cycle, d.tag().c_str(), (unsigned long long)rep.bad_bytes,
        (unsigned long long)rep.bytes_checked, (unsigned long long)rep.bad_samples,
        (unsigned long long)rep.samples, rep.first_bad.c_str());
    ok = false;
  } else {
    std::printf("[%s] cycle %d: verified tag %s: %llu bytes byte-for-byte + %llu sampled windows\n",
                scenario.c_str(), cycle, d.tag().c_str(), (unsigned long long)rep.bytes_checked,
                (unsigned long long)rep.samples);
  }
  std::fflush(stdout);
  if (!ok) e.ok = false;
  return ok;
}

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

}  // namespace tagmem::bench
