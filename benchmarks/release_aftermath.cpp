// release_aftermath.cpp — what the physical-memory steps of a phase switch cost the steps after
// them. An RL phase switch gives the engine's KV cache back to the driver (cuMemUnmap +
// cuMemRelease of tens of GiB), creates it again later (cuMemCreate + cuMemMap) and reloads the
// trainer's weights (host to device copies) in between. Each sequence below runs such steps in
// order on one --released range, with pauses that let the earlier steps settle, so that a slow
// copy or create is attributed to the step that caused it:
//   create, map, unmap, release   the driver calls over the range in --mapping handles (timed;
//                                 a step's second occurrence in a sequence is reported as "2")
//   use                           cuMemsetD8 over the range (the cache was written), synchronized
//   sleepN                        N milliseconds
//   copy                          an H2D copy of --copy bytes from pinned memory in tagmem's copy
//                                 shape (--piece pieces round-robin over --streams streams): its
//                                 rate overall and in its first and last quarter
//   kcopy                         the same bytes copied by tagmem's copy kernel (kernel_copy.hpp),
//                                 piece after piece on its stream, reported as "copy"
// Each repeat starts a second after the last one's range was released. Medians of --repeats; the
// copied bytes are verified.
//
//   tagmem_bench_release_aftermath [--copy=16G] [--released=60G] [--mapping=16G] [--piece=64M]
//                                  [--streams=2] [--repeats=3] [--sequences="create map copy;..."]
//                                  [--tsv=F]
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <thread>

#include "bench_support.hpp"
#include "device/kernel_copy.hpp"
#include "transfer/copy_queue.hpp"

using namespace tagmem::bench;

namespace {

struct options {
  std::size_t copy = 0, released = 0, mapping = 0, piece = 0, streams = 0;
  int repeats = 0;
};

CUmemAllocationProp device0_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  return p;
}

// A reserved range backed by --mapping-sized handles, as tagmem backs a DISCARD tag.
class backed_range {
 public:
  backed_range(std::size_t bytes, std::size_t mapping) : bytes_(bytes), mapping_(mapping) {
    BENCH_CU(cuMemAddressReserve, &va_, bytes_, 0, 0, 0);
    handles_.resize((bytes_ + mapping_ - 1) / mapping_);
  }
  ~backed_range() {
    unmap();
    release();
    cu().cuMemAddressFree(va_, bytes_);
  }
  backed_range(const backed_range&) = delete;
  backed_range& operator=(const backed_range&) = delete;

  void create() {
    auto prop = device0_prop();
    for (std::size_t i = 0; i < handles_.size(); ++i)
      BENCH_CU(cuMemCreate, &handles_[i], size(i), &prop, 0);
    made_ = true;
  }
  void map() {
    CUmemAccessDesc access{device0_prop().location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (std::size_t i = 0; i < handles_.size(); ++i) {
      BENCH_CU(cuMemMap, va_ + i * mapping_, size(i), 0, handles_[i], 0);
      BENCH_CU(cuMemSetAccess, va_ + i * mapping_, size(i), &access, 1);
    }
    mapped_ = true;
  }
  void unmap() noexcept {
    if (mapped_)
      for (std::size_t i = 0; i < handles_.size(); ++i)
        cu().cuMemUnmap(va_ + i * mapping_, size(i));
    mapped_ = false;
  }
  void release() noexcept {
    if (made_)
      for (CUmemGenericAllocationHandle h : handles_) cu().cuMemRelease(h);
    made_ = false;
  }
  void use() {  // the KV cache was written before it is discarded
    BENCH_CU(cuMemsetD8Async, va_, 0x5a, bytes_, nullptr);
    BENCH_CU(cuCtxSynchronize, nullptr);
  }

 private:
  std::size_t size(std::size_t i) const { return std::min(mapping_, bytes_ - i * mapping_); }
  CUdeviceptr va_ = 0;
  std::size_t bytes_, mapping_;
  std::vector<CUmemGenericAllocationHandle> handles_;
  bool made_ = false, mapped_ = false;
};

// The H2D copy: pinned source, a cuMemAlloc destination, pieces round-robin over the streams,
// a timing event after every piece.
class h2d_copy {
 public:
  h2d_copy(std::size_t bytes, std::size_t piece, std::size_t streams)
      : src_(bytes), bytes_(bytes), piece_(piece), streams_(streams) {
    fill_random(src_.data(), bytes, 7);
    BENCH_CU(cuMemAlloc, &dst_, bytes);
    for (CUstream& s : streams_) BENCH_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
    BENCH_CU(cuEventCreate, &start_, CU_EVENT_DEFAULT);
    for (std::size_t off = 0; off < bytes; off += piece)
      BENCH_CU(cuEventCreate, &after_.emplace_back(), CU_EVENT_DEFAULT);
    kernel_.load(0, 0);  // device 0, current since the source was pinned
  }
  ~h2d_copy() {
    kernel_.unload();
    for (CUevent e : after_) cu().cuEventDestroy(e);
    cu().cuEventDestroy(start_);
    for (CUstream s : streams_) cu().cuStreamDestroy(s);
    cu().cuMemFree(dst_);
  }
  h2d_copy(const h2d_copy&) = delete;
  h2d_copy& operator=(const h2d_copy&) = delete;

  struct rates {
    double all, first_quarter, last_quarter;  // GB/s
  };
  enum class by { copy_engines, kernel };
  rates run(by who) {
    if (who == by::kernel && kernel_.stream() == nullptr)
      throw std::runtime_error("no copy kernel");
    std::vector<CUstream> lanes = streams_;
    if (who == by::kernel) lanes = {kernel_.stream()};
    BENCH_CU(cuMemsetD8Async, dst_ + bytes_ - checked_bytes(), 0, checked_bytes(), lanes[0]);
    BENCH_CU(cuStreamSynchronize, lanes[0]);  // zeroed for verify(), before the clock starts
    BENCH_CU(cuEventRecord, start_, lanes[0]);
    for (std::size_t i = 1; i < lanes.size(); ++i) BENCH_CU(cuStreamWaitEvent, lanes[i], start_, 0);
    std::size_t k = 0;
    for (std::size_t off = 0; off < bytes_; off += piece_, ++k) {
      CUstream s = lanes[k % lanes.size()];
      const std::size_t n = std::min(piece_, bytes_ - off);
      if (who == by::kernel) {
        kernel_.launch(dst_ + off, src_.data() + off, n);
      } else {
        BENCH_CU(cuMemcpyHtoDAsync, dst_ + off, src_.data() + off, n, s);
      }
      BENCH_CU(cuEventRecord, after_[k], s);
    }
    for (CUstream s : lanes) BENCH_CU(cuStreamSynchronize, s);
    std::vector<float> at(after_.size());
    for (std::size_t i = 0; i < at.size(); ++i)
      BENCH_CU(cuEventElapsedTime, &at[i], start_, after_[i]);
    std::sort(at.begin(), at.end());  // completion times; pieces are equal but the last
    const std::size_t n = at.size(), q = std::max<std::size_t>(1, n / 4);
    auto gbps = [&](std::size_t pieces, double ms) {
      return ms > 0 ? pieces * double(piece_) / ms / 1e6 : 0;
    };
    return {bytes_ / double(at.back()) / 1e6, gbps(q, at[q - 1]),
            n > q ? gbps(q, at[n - 1] - at[n - 1 - q]) : 0};
  }
  // The copy's last checked_bytes() are the source's.
  bool verify() {
    std::vector<unsigned char> back(checked_bytes());
    BENCH_CU(cuMemcpyDtoH, back.data(), dst_ + bytes_ - back.size(), back.size());
    return std::equal(back.begin(), back.end(), src_.data() + bytes_ - back.size());
  }

 private:
  std::size_t checked_bytes() const { return std::min<std::size_t>(bytes_, 64u << 20); }

  pinned_buffer src_;
  std::size_t bytes_, piece_;
  CUdeviceptr dst_ = 0;
  std::vector<CUstream> streams_;
  CUevent start_ = nullptr;
  std::vector<CUevent> after_;
  tagmem::kernel_copy kernel_;
};

double ms_of(auto&& f) {
  auto t0 = clock::now();
  f();
  return seconds_since(t0) * 1e3;
}

// A sequence is steps separated by spaces, run in order on one --released range:
// create, map, use (cuMemsetD8 over it), unmap, release, sleepN (N milliseconds), copy.
struct timing {
  std::map<std::string, std::vector<double>> ms;  // per step name, one entry per repeat
  std::vector<double> all, first, last;           // the copy's GB/s
};

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

void run_sequence(const options& o, h2d_copy& copy, const std::string& sequence, timing& t) {
  for (int r = 0; r < o.repeats; ++r) {
    // The previous repeat's range was released on its way out: let that settle first, so that
    // every sequence starts from a quiet driver.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    backed_range range(o.released, o.mapping);
    std::map<std::string, double> step_ms;
    std::map<std::string, int> seen;
    for (const std::string& step : split(sequence, ' ')) {
      const std::string label = ++seen[step] > 1 ? step + " " + std::to_string(seen[step]) : step;
      if (step.rfind("sleep", 0) == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(step.substr(5))));
      } else if (step == "copy" || step == "kcopy") {
        auto rate = copy.run(step == "copy" ? h2d_copy::by::copy_engines : h2d_copy::by::kernel);
        if (!copy.verify()) throw std::runtime_error("'" + step + "' copied wrong bytes");
        t.all.push_back(rate.all);
        t.first.push_back(rate.first_quarter);
        t.last.push_back(rate.last_quarter);
      } else if (step == "create") {
        step_ms[label] = ms_of([&] { range.create(); });
      } else if (step == "map") {
        step_ms[label] = ms_of([&] { range.map(); });
      } else if (step == "use") {
        range.use();
      } else if (step == "unmap") {
        step_ms[label] = ms_of([&] { range.unmap(); });
      } else if (step == "release") {
        step_ms[label] = ms_of([&] { range.release(); });
      } else {
        throw std::invalid_argument("unknown step '" + step + "' in --sequences");
      }
    }
    for (auto& [name, ms] : step_ms) t.ms[name].push_back(ms);
  }
}

}  // namespace

// Each isolates one step of the cycle (pause kv: unmap, release; resume kv: create, map; resume
// weights: copy) by letting the others settle for a second first.
const char* const default_sequences =
    "copy;"
    "create map copy;"
    "create sleep1000 map copy;"
    "create map sleep1000 copy;"
    "create map use sleep1000 unmap release copy;"
    "create map use sleep1000 unmap release sleep250 copy;"
    "create map use sleep1000 unmap release create map copy;"
    "create map use sleep1000 unmap release sleep1000 create map copy;"
    "create map sleep1000 unmap release sleep1000 create map copy;"
    "create map use sleep1000 unmap map copy;"
    "kcopy;"
    "create map use sleep1000 unmap release kcopy;"
    "create map use sleep1000 unmap release copy";

int main(int argc, char** argv) {
  args a(argc, argv,
         {"copy", "released", "mapping", "sequences", "piece", "streams", "repeats", "tsv"});
  options o;
  try {
    o.copy = a.bytes("copy", 16ull << 30);
    o.released = a.bytes("released", 60ull << 30);
    o.mapping = a.bytes("mapping", 16ull << 30);
    o.piece = a.bytes("piece", 64u << 20);
    o.streams = std::size_t(std::max(0.0, a.num("streams", 2)));
    o.repeats = int(a.num("repeats", 3));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "tagmem_bench_release_aftermath: bad option: %s\n", ex.what());
    return 2;
  }
  if (!a.ok() || !o.copy || !o.released || !o.mapping || !o.piece || !o.streams || o.repeats < 1) {
    std::fprintf(stderr, "tagmem_bench_release_aftermath: %s\n",
                 a.ok() ? "sizes and --repeats must be > 0" : a.error().c_str());
    return 2;
  }
  results out;
  bool ok = true;
  try {
    use_device0();
    std::size_t gran = 0;
    auto prop = device0_prop();
    BENCH_CU(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    o.mapping = (o.mapping + gran - 1) / gran * gran;
    o.released = (o.released + gran - 1) / gran * gran;
    std::printf(
        "# release aftermath: copy %s H2D after %s released in %g MiB handles; median of %d; %s "
        "driver\n",
        format_bytes(o.copy).c_str(), format_bytes(o.released).c_str(), o.mapping / 1048576.0,
        o.repeats, using_emulator() ? "EMULATED" : "real CUDA");
    h2d_copy copy(o.copy, o.piece, o.streams);
    copy.run(h2d_copy::by::copy_engines);  // warm-up
    copy.run(h2d_copy::by::kernel);
    for (const std::string& sequence : split(a.str("sequences", default_sequences), ';')) {
      timing t;
      run_sequence(o, copy, sequence, t);
      if (!t.all.empty())
        out.add(sequence, "H2D GB/s (first, last quarter)", fixed(median(t.all), 2),
                fixed(median(t.first), 2) + ", " + fixed(median(t.last), 2));
      for (auto& [name, ms] : t.ms) out.add(sequence, name + " ms", fixed(median(ms), 2));
    }
    ok = copy.verify();
    if (!ok) std::printf("ERROR: the copied bytes differ from the source\n");
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  out.print(
      "release aftermath: the copy and the create right after memory goes back to the driver");
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
