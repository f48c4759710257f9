// link_anatomy.cpp — where the swap's last 11 % goes. tagmem_swap (16 GB out while 16 GB in)
// reaches 0.89 of the raw bidirectional link: one cuMemcpyHtoDAsync and one cuMemcpyDtoHAsync of
// cuMemAlloc buffers on two streams. The swap differs from that in its copy shape (pieces
// round-robin over several streams a direction), its memory (cuMemCreate mappings in a reserved
// range) and its pipeline (Note [unmap as copied]). The variants add these one at a time, so the
// step where the rate drops names the cost:
//   1. one-way: H2D alone, then D2H alone; their sum is what the swap target divides by (<= 0.65)
//   2. bidir one copy: both directions at once, one copy each: the ceiling
//   3. bidir pieces: tagmem's copy shape on cuMemAlloc memory
//   4. bidir pieces, vmm: on reserved ranges, every mapping made beforehand
//   5. ..., remap: out-mappings unmapped and released as their pieces finish, in-mappings made
//      just before their pieces are queued, all in one loop on one thread (tagmem's pipeline)
//   6. ..., release after: as 5, but every cuMemRelease waits until the copies are done
// A run is timed from its first enqueue until every stream is done (wall clock), and per
// direction by events counted from one start event that every stream waits for. Medians of
// --repeats after a warm-up; the last run's bytes are verified.
//
//   tagmem_bench_link_anatomy [--bytes=16G] [--repeats=3] [--piece=64M] [--streams=2]
//                             [--mapping=1G] [--tsv=anatomy.tsv]
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "bench_support.hpp"

using namespace tagmem::bench;

namespace {

struct options {
  std::size_t bytes = 0, piece = 0, mapping = 0, streams = 0;  // streams: per direction
  int repeats = 0;
};

// ---- device memory ------------------------------------------------------------------------

const CUmemAllocationProp& device0_memory() {
  static const CUmemAllocationProp prop = [] {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    return p;
  }();
  return prop;
}

// One side's device memory: a cuMemAlloc buffer, or a reserved range of `mapping`-sized physical
// allocations made (cuMemCreate + cuMemMap + cuMemSetAccess), unmapped and released one at a
// time, as tagmem maps its segments. The destructor frees whatever is left.
class device_side {
 public:
  device_side(std::size_t bytes, std::size_t mapping, std::size_t granularity, bool vmm)
      : vmm_(vmm), mapping_(mapping) {
    if (!vmm) {
      BENCH_CU(cuMemAlloc, &va_, bytes);
      return;
    }
    span_ = (bytes + granularity - 1) / granularity * granularity;
    BENCH_CU(cuMemAddressReserve, &va_, span_, granularity, 0, 0);
    handles_.resize((span_ + mapping - 1) / mapping);
    state_.resize(handles_.size(), none);
  }
  ~device_side() {
    unmap_all();
    if (vmm_) {
      cu().cuMemAddressFree(va_, span_);
    } else {
      cu().cuMemFree(va_);
    }
  }
  device_side(const device_side&) = delete;
  device_side& operator=(const device_side&) = delete;

  CUdeviceptr ptr() const { return va_; }
  void map(std::size_t i) {
    CUmemAccessDesc access{device0_memory().location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    BENCH_CU(cuMemCreate, &handles_[i], size(i), &device0_memory(), 0);
    state_[i] = made;
    BENCH_CU(cuMemMap, at(i), size(i), 0, handles_[i], 0);
    state_[i] = mapped;
    BENCH_CU(cuMemSetAccess, at(i), size(i), &access, 1);
  }
  void unmap(std::size_t i) {
    BENCH_CU(cuMemUnmap, at(i), size(i));
    state_[i] = made;
  }
  void release(std::size_t i) {
    BENCH_CU(cuMemRelease, handles_[i]);
    state_[i] = none;
  }
  void map_all() {
    for (std::size_t i = 0; i < state_.size(); ++i)
      if (state_[i] == none) map(i);
  }
  void unmap_all() noexcept {  // and release; errors ignored (also the destructor's cleanup)
    for (std::size_t i = 0; i < state_.size(); ++i) {
      if (state_[i] == mapped) cu().cuMemUnmap(at(i), size(i));
      if (state_[i] != none) cu().cuMemRelease(handles_[i]);
      state_[i] = none;
    }
  }

 private:
  enum state { none, made, mapped };
  CUdeviceptr at(std::size_t i) const { return va_ + i * mapping_; }
  std::size_t size(std::size_t i) const { return std::min(mapping_, span_ - i * mapping_); }
  bool vmm_;
  CUdeviceptr va_ = 0;
  std::size_t span_ = 0, mapping_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  std::vector<state> state_;
};

// ---- the rig: host buffers, copy plan, streams, events ------------------------------------

struct piece {
  std::size_t off, len;
};

struct rig {
  explicit rig(const options& o) : n(o.bytes), src(n), dst(n) {
    for (std::size_t m = 0; m < n; m += o.mapping) {
      first.push_back(pieces.size());
      for (std::size_t off = m, end = std::min(n, m + o.mapping); off < end; off += o.piece)
        pieces.push_back({off, std::min(o.piece, end - off)});
    }
    first.push_back(pieces.size());
    fill_random(src.data(), n, seed);
    for (std::size_t i = 0; i < o.streams; ++i) {
      BENCH_CU(cuStreamCreate, &h2d.emplace_back(), CU_STREAM_NON_BLOCKING);
      BENCH_CU(cuStreamCreate, &d2h.emplace_back(), CU_STREAM_NON_BLOCKING);
      BENCH_CU(cuEventCreate, &h2d_end.emplace_back(), CU_EVENT_DEFAULT);
      BENCH_CU(cuEventCreate, &d2h_end.emplace_back(), CU_EVENT_DEFAULT);
    }
    for (std::size_t k = 0; k < pieces.size(); ++k)
      BENCH_CU(cuEventCreate, &fired.emplace_back(), CU_EVENT_DISABLE_TIMING);
    BENCH_CU(cuEventCreate, &start, CU_EVENT_DEFAULT);
  }
  ~rig() {
    for (auto* e : {&h2d_end, &d2h_end, &fired})
      for (CUevent x : *e) cu().cuEventDestroy(x);
    cu().cuEventDestroy(start);
    for (auto* s : {&h2d, &d2h})
      for (CUstream x : *s) cu().cuStreamDestroy(x);
  }
  const std::size_t n;
  std::vector<piece> whole{{0, n}};
  std::vector<piece> pieces;       // at most --piece each, never across a mapping, in order
  std::vector<std::size_t> first;  // mapping i's pieces are [first[i], first[i + 1])
  pinned_buffer src, dst;          // the H2D source and the D2H destination
  std::vector<CUstream> h2d, d2h;  // --streams each
  CUevent start = nullptr;
  std::vector<CUevent> h2d_end, d2h_end;  // one per stream
  std::vector<CUevent> fired;             // one per piece, for the remap loop
  std::uint64_t seed = 1;
};

// ---- timed runs ---------------------------------------------------------------------------

struct run_times {
  double total_ms = 0, copies_ms = 0;  // wall clock: all done / copies done (differ in 6 only)
  double h2d_ms = 0, d2h_ms = 0;       // when each direction's last copy finished
};

void copy(rig& r, bool to_device, CUdeviceptr dev, piece p, std::size_t k) {
  if (to_device) {
    BENCH_CU(cuMemcpyHtoDAsync, dev + p.off, r.src.data() + p.off, p.len, r.h2d[k % r.h2d.size()]);
  } else {
    BENCH_CU(cuMemcpyDtoHAsync, r.dst.data() + p.off, dev + p.off, p.len, r.d2h[k % r.d2h.size()]);
  }
}

// Every stream waits for one start event, so that the end events of all count from one point.
void mark_start(rig& r) {
  BENCH_CU(cuEventRecord, r.start, r.d2h[0]);
  for (CUstream s : r.h2d) BENCH_CU(cuStreamWaitEvent, s, r.start, 0);
  for (std::size_t i = 1; i < r.d2h.size(); ++i) BENCH_CU(cuStreamWaitEvent, r.d2h[i], r.start, 0);
}

void mark_end(const std::vector<CUstream>& streams, const std::vector<CUevent>& ends) {
  for (std::size_t i = 0; i < streams.size(); ++i) BENCH_CU(cuEventRecord, ends[i], streams[i]);
}

double ms_after_start(rig& r, const std::vector<CUevent>& ends) {
  float last = 0, ms = 0;
  for (CUevent e : ends) {
    BENCH_CU(cuEventElapsedTime, &ms, r.start, e);
    last = std::max(last, ms);
  }
  return last;
}

run_times finish(rig& r, clock::time_point t0) {
  for (auto* s : {&r.h2d, &r.d2h})
    for (CUstream x : *s) BENCH_CU(cuStreamSynchronize, x);
  double wall = seconds_since(t0) * 1e3;
  return {wall, wall, ms_after_start(r, r.h2d_end), ms_after_start(r, r.d2h_end)};
}

// Variants 1-4: every copy queued at once, each direction round-robin over its streams.
run_times queued(rig& r, const std::vector<piece>& plan, const device_side* in,
                 const device_side* out) {
  auto t0 = clock::now();
  mark_start(r);
  for (std::size_t k = 0; k < plan.size(); ++k) {
    if (in) copy(r, true, in->ptr(), plan[k], k);
    if (out) copy(r, false, out->ptr(), plan[k], k);
  }
  mark_end(r.h2d, r.h2d_end);
  mark_end(r.d2h, r.d2h_end);
  return finish(r, t0);
}

bool has_fired(CUevent e) {
  CUresult res = cu().cuEventQuery(e);
  if (res == CUDA_ERROR_NOT_READY) return false;
  tagmem::driver::check(res, "cuEventQuery");
  return true;
}

// Variants 5 and 6, Note [unmap as copied] without tagmem: every D2H piece queued at once with an
// event after it, then one loop that unmaps the next out-mapping once its pieces have fired, else
// maps the next in-mapping and queues its H2D pieces, else blocks on the oldest pending piece.
run_times remap(rig& r, device_side& in, device_side& out, bool release_inline) {
  const std::size_t count = r.first.size() - 1;
  auto t0 = clock::now();
  mark_start(r);
  for (std::size_t k = 0; k < r.pieces.size(); ++k) {
    copy(r, false, out.ptr(), r.pieces[k], k);
    BENCH_CU(cuEventRecord, r.fired[k], r.d2h[k % r.d2h.size()]);
  }
  mark_end(r.d2h, r.d2h_end);
  std::size_t done = 0, unmapped = 0, mapped = 0;  // pieces [0, done) have fired
  while (unmapped < count || mapped < count) {
    while (done < r.pieces.size() && has_fired(r.fired[done])) ++done;
    if (unmapped < count && done >= r.first[unmapped + 1]) {
      out.unmap(unmapped);
      if (release_inline) out.release(unmapped);
      ++unmapped;
    } else if (mapped < count) {
      in.map(mapped);
      for (std::size_t k = r.first[mapped]; k < r.first[mapped + 1]; ++k)
        copy(r, true, in.ptr(), r.pieces[k], k);
      ++mapped;
    } else {
      BENCH_CU(cuEventSynchronize, r.fired[done]);
    }
  }
  mark_end(r.h2d, r.h2d_end);
  run_times t = finish(r, t0);
  if (!release_inline) {
    for (std::size_t i = 0; i < count; ++i) out.release(i);
    t.total_ms = seconds_since(t0) * 1e3;
  }
  return t;
}

// ---- verification and repeats -------------------------------------------------------------

// memcmp on several threads: the buffers are tens of GB.
bool same(const unsigned char* a, const unsigned char* b, std::size_t n) {
  const std::size_t per = n / std::clamp(std::thread::hardware_concurrency(), 1u, 16u) + 1;
  std::atomic<bool> equal{true};
  std::vector<std::thread> pool;
  for (std::size_t off = 0; off < n; off += per)
    pool.emplace_back([&, off] {
      if (std::memcmp(a + off, b + off, std::min(per, n - off)) != 0) equal = false;
    });
  for (auto& th : pool) th.join();
  return equal;
}

// Before the verified run: a fresh pattern in the H2D source and, on the out side, the same
// pattern rotated by a third, so that neither stale bytes of an earlier run nor a piece copied to
// the wrong offset or in the wrong direction can pass.
void arm_check(rig& r, const device_side* out) {
  fill_random(r.src.data(), r.n, ++r.seed);
  const std::size_t s = r.n / 3;
  if (out) BENCH_CU(cuMemcpyHtoD, out->ptr(), r.src.data() + s, r.n - s);
  if (out && s) BENCH_CU(cuMemcpyHtoD, out->ptr() + (r.n - s), r.src.data(), s);
}

bool check(rig& r, const std::string& name, const device_side* in, const device_side* out) {
  const std::size_t s = r.n / 3;
  const unsigned char* want = r.src.data();
  bool d2h_ok =
      !out || (same(r.dst.data(), want + s, r.n - s) && same(r.dst.data() + r.n - s, want, s));
  if (!d2h_ok)
    std::printf("ERROR: %s: the D2H destination differs from the device side\n", name.c_str());
  if (in) BENCH_CU(cuMemcpyDtoH, r.dst.data(), in->ptr(), r.n);
  bool h2d_ok = !in || same(r.dst.data(), want, r.n);
  if (!h2d_ok)
    std::printf("ERROR: %s: the H2D destination differs from the source\n", name.c_str());
  return d2h_ok && h2d_ok;
}

struct measured {
  std::string name;
  run_times t;  // medians
  bool verified = false;
};

// A warm-up and `repeats` runs of `once`, each after `prepare` (untimed); the last one verified.
// `in` and `out` are the sides the runs copy to and from (null: that direction is not copied).
measured measure(rig& r, int repeats, std::string name, const device_side* in,
                 const device_side* out, const std::function<void()>& prepare,
                 const std::function<run_times()>& once) {
  std::vector<run_times> runs;
  for (int i = 0; i <= repeats; ++i) {
    prepare();
    if (i == repeats) arm_check(r, out);
    run_times t = once();
    if (i > 0) runs.push_back(t);
  }
  auto med = [&](double run_times::*f) {
    std::vector<double> v;
    for (const auto& t : runs) v.push_back(t.*f);
    return median(v);
  };
  const bool verified = check(r, name, in, out);
  measured m{std::move(name),
             {med(&run_times::total_ms), med(&run_times::copies_ms), med(&run_times::h2d_ms),
              med(&run_times::d2h_ms)},
             verified};
  std::printf("[anatomy] %s: %.1f ms, bytes %s\n", m.name.c_str(), m.t.total_ms,
              m.verified ? "verified" : "DIFFER");
  std::fflush(stdout);
  return m;
}

void measure_all(rig& r, const options& o, std::size_t gran, std::vector<measured>& done) {
  auto nothing = [] {};
  {
    device_side in(o.bytes, o.mapping, gran, false), out(o.bytes, o.mapping, gran, false);
    measured h2d = measure(r, o.repeats, "one-way H2D", &in, nullptr, nothing,
                           [&] { return queued(r, r.whole, &in, nullptr); });
    measured d2h = measure(r, o.repeats, "one-way D2H", nullptr, &out, nothing,
                           [&] { return queued(r, r.whole, nullptr, &out); });
    double sum = h2d.t.total_ms + d2h.t.total_ms;
    done.push_back(
        {"one-way", {sum, sum, h2d.t.total_ms, d2h.t.total_ms}, h2d.verified && d2h.verified});
    done.push_back(measure(r, o.repeats, "bidir one copy", &in, &out, nothing,
                           [&] { return queued(r, r.whole, &in, &out); }));
    done.push_back(measure(r, o.repeats, "bidir pieces", &in, &out, nothing,
                           [&] { return queued(r, r.pieces, &in, &out); }));
  }
  device_side in(o.bytes, o.mapping, gran, true), out(o.bytes, o.mapping, gran, true);
  auto map_both = [&] {
    in.map_all();
    out.map_all();
  };
  auto map_out_only = [&] {  // and the in side unmapped, after the last run's check read it back
    in.unmap_all();
    out.map_all();
  };
  done.push_back(measure(r, o.repeats, "bidir pieces, vmm", &in, &out, map_both,
                         [&] { return queued(r, r.pieces, &in, &out); }));
  done.push_back(measure(r, o.repeats, "bidir pieces, vmm, remap", &in, &out, map_out_only,
                         [&] { return remap(r, in, out, true); }));
  done.push_back(measure(r, o.repeats, "... remap, release after", &in, &out, map_out_only,
                         [&] { return remap(r, in, out, false); }));
}

void report(results& out, const std::vector<measured>& done, std::size_t bytes) {
  const double one_way = done.empty() ? NAN : done[0].t.total_ms;
  const double ceiling = done.size() < 2 ? NAN : done[1].t.total_ms;
  for (const measured& m : done) {
    const run_times& t = m.t;
    out.add(m.name, "ms", fixed(t.total_ms, 1),
            (m.name == "one-way" ? "H2D alone + D2H alone: " : "H2D / D2H done at: ") +
                fixed(t.h2d_ms, 1) + " / " + fixed(t.d2h_ms, 1) +
                (m.verified ? " ms; bytes verified" : " ms; BYTES DIFFER"));
    if (t.copies_ms != t.total_ms)
      out.add(m.name, "ms until the copies were done", fixed(t.copies_ms, 1), "releases after");
    out.add(m.name, "GB/s both ways", fixed(2.0 * bytes / t.total_ms / 1e6, 2),
            fixed(ceiling / t.total_ms, 3) + " of bidir one copy");
    out.add(m.name, "time / one-way sum", fixed(t.total_ms / one_way, 3), "swap target <= 0.65");
  }
}

}  // namespace

int main(int argc, char** argv) {
  args a(argc, argv, {"bytes", "repeats", "piece", "streams", "mapping", "tsv"});
  options o;
  try {
    o.bytes = a.bytes("bytes", 16ull << 30);
    o.piece = a.bytes("piece", 64u << 20);
    o.mapping = a.bytes("mapping", 1ull << 30);
    o.streams = std::size_t(std::max(0.0, a.num("streams", 2)));
    o.repeats = int(a.num("repeats", 3));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "tagmem_bench_link_anatomy: bad option: %s\n", ex.what());
    return 2;
  }
  if (!a.ok() || !o.bytes || !o.piece || !o.mapping || !o.streams || o.repeats < 1) {
    std::fprintf(stderr, "tagmem_bench_link_anatomy: %s\n",
                 a.ok() ? "sizes, --streams and --repeats must be > 0" : a.error().c_str());
    return 2;
  }
  results out;
  std::vector<measured> done;
  bool ok = true;
  try {
    use_device0();
    std::size_t gran = 0;
    BENCH_CU(cuMemGetAllocationGranularity, &gran, &device0_memory(),
             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    o.mapping = (o.mapping + gran - 1) / gran * gran;
    std::printf(
        "# link anatomy: %s each way; %g MiB pieces over %zu streams a direction; %g MiB "
        "mappings; median of %d; %s driver\n",
        format_bytes(o.bytes).c_str(), o.piece / 1048576.0, o.streams, o.mapping / 1048576.0,
        o.repeats, using_emulator() ? "EMULATED" : "real CUDA");
    rig r(o);
    measure_all(r, o, gran, done);
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  for (const measured& m : done) ok = ok && m.verified;
  report(out, done, o.bytes);
  out.print("link anatomy: the swap's copies, one difference from the raw link at a time");
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
