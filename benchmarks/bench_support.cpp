// bench_support.cpp — knobs, driver access, pinned buffers, timing and tables (see header).
#include "bench_support.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "observe/json_text.hpp"
#include "options/options.hpp"

namespace tagmem::bench {

// ---- arguments ----------------------------------------------------------------------------

args::args(int argc, char** argv, std::vector<std::string> known) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      error_ = "unexpected argument '" + a + "'";
      return;
    }
    auto eq = a.find('=');
    std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::string value = eq == std::string::npos ? "1" : a.substr(eq + 1);
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      error_ = "unknown option --" + key;
      return;
    }
    values_[key] = value;
  }
}

std::string args::str(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

double args::num(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : std::stod(it->second);
}

std::size_t args::bytes(const std::string& key, std::size_t fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : parse_bytes(it->second);
}

std::size_t parse_bytes(const std::string& text) {
  const parsed_size p = parse_size(text);  // the library's reading of a size (size_text.hpp)
  if (!p.ok) throw std::invalid_argument("'" + text + "' " + p.why);
  return p.bytes;
}

std::string format_bytes(std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GB (%.2f GiB)", bytes / 1e9, bytes / double(1ull << 30));
  return buf;
}

// ---- driver -------------------------------------------------------------------------------

const driver::table& cu() { return driver::api(); }

CUcontext use_device0() {
  static CUcontext ctx = [] {
    driver::load();
    CUdevice dev = 0;
    CUcontext c = nullptr;
    BENCH_CU(cuDeviceGet, &dev, 0);
    BENCH_CU(cuDevicePrimaryCtxRetain, &c, dev);
    return c;
  }();
  BENCH_CU(cuCtxSetCurrent, ctx);
  return ctx;
}

bool using_emulator() { return std::strstr(option_text(option::LIBCUDA), "tagmem_emu") != nullptr; }

// ---- host memory --------------------------------------------------------------------------

namespace {

unsigned worker_count() { return std::clamp(std::thread::hardware_concurrency(), 1u, 16u); }

template <class F>
void parallel_slices(std::size_t n, std::size_t align, F&& body) {
  unsigned t = worker_count();
  std::size_t per = (n / t + align - 1) / align * align;
  if (per == 0) per = align;
  std::vector<std::thread> pool;
  for (std::size_t start = per; start < n; start += per) {
    pool.emplace_back([&, start] { body(start, std::min(per, n - start)); });
  }
  body(0, std::min(per, n));
  for (auto& th : pool) th.join();
}

}  // namespace

pinned_buffer::pinned_buffer(std::size_t bytes) {
  constexpr std::size_t huge = 2u << 20;
  size_ = (std::max<std::size_t>(bytes, 1) + huge - 1) / huge * huge;
  void* p = mmap(nullptr, size_ + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap of a benchmark buffer failed");
  auto start = reinterpret_cast<std::uintptr_t>(p);
  auto aligned = (start + huge - 1) / huge * huge;
  if (aligned > start) munmap(p, aligned - start);
  std::size_t tail = start + size_ + huge - (aligned + size_);
  if (tail) munmap(reinterpret_cast<void*>(aligned + size_), tail);
  data_ = reinterpret_cast<unsigned char*>(aligned);
  madvise(data_, size_, MADV_HUGEPAGE);
  parallel_slices(size_, 4096, [&](std::size_t off, std::size_t n) {
    for (std::size_t i = 0; i < n; i += 4096) data_[off + i] = 0;
  });
  use_device0();
  CUresult r = cu().cuMemHostRegister(data_, size_,
                                      CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    munmap(data_, size_);
    data_ = nullptr;
    driver::throw_error(r, "cuMemHostRegister");
  }
}

pinned_buffer::~pinned_buffer() {
  if (!data_) return;
  use_device0();
  cu().cuMemHostUnregister(data_);
  munmap(data_, size_);
}

pinned_buffer::pinned_buffer(pinned_buffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
}

pinned_buffer& pinned_buffer::operator=(pinned_buffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill_random(unsigned char* p, std::size_t n, std::uint64_t seed) {
  parallel_slices(n, 8, [&](std::size_t off, std::size_t len) {
    for (std::size_t i = 0; i < len; i += 8) {
      std::uint64_t v = mix(seed ^ mix(off + i));
      std::memcpy(p + off + i, &v, std::min<std::size_t>(8, len - i));
    }
  });
}

// ---- timing and tables --------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double copy_rate(const std::vector<host_range>& ranges, CUdeviceptr dev, std::size_t dev_bytes,
                 bool to_host, CUstream s) {
  auto once = [&] {
    for (const host_range& r : ranges) {
      for (std::size_t off = 0; off < r.size; off += dev_bytes) {
        const std::size_t n = std::min(dev_bytes, r.size - off);
        if (to_host) {
          BENCH_CU(cuMemcpyDtoHAsync, r.base + off, dev, n, s);
        } else {
          BENCH_CU(cuMemcpyHtoDAsync, dev, r.base + off, n, s);
        }
      }
    }
    BENCH_CU(cuStreamSynchronize, s);
  };
  once();
  std::vector<double> t;
  std::size_t total = 0;
  for (const host_range& r : ranges) total += r.size;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = clock::now();
    once();
    t.push_back(seconds_since(t0));
  }
  return total / median(t) / 1e9;
}

std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void results::add(std::string scenario, std::string metric, std::string value, std::string note) {
  rows_.push_back({std::move(scenario), std::move(metric), std::move(value), std::move(note)});
}

void results::print(const std::string& title) const {
  std::size_t w[3] = {8, 6, 5};
  for (const auto& r : rows_) {
    w[0] = std::max(w[0], r.scenario.size());
    w[1] = std::max(w[1], r.metric.size());
    w[2] = std::max(w[2], r.value.size());
  }
  std::printf("\n== %s ==\n", title.c_str());
  std::printf("%-*s  %-*s  %*s  %s\n", int(w[0]), "scenario", int(w[1]), "metric", int(w[2]),
              "value", "note");
  for (const auto& r : rows_) {
    std::printf("%-*s  %-*s  %*s  %s\n", int(w[0]), r.scenario.c_str(), int(w[1]), r.metric.c_str(),
                int(w[2]), r.value.c_str(), r.note.c_str());
  }
  std::fflush(stdout);
}

void results::write_tsv(const std::string& path) const {
  if (path.empty()) return;
  std::ofstream out(path);
  out << "scenario\tmetric\tvalue\tnote\n";
  for (const auto& r : rows_) {
    out << r.scenario << '\t' << r.metric << '\t' << r.value << '\t' << r.note << '\n';
  }
  const std::size_t dot = path.rfind(".tsv");
  if (dot != std::string::npos && dot + 4 == path.size()) write_json(path.substr(0, dot) + ".json");
}

// A value that is one number is written as a JSON number, anything else ("12.1,11.9,22.8",
// "n/a") as a string.
static std::string json_value(const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (!v.empty() && end == v.c_str() + v.size() && std::isfinite(d)) return v;
  return json_quoted(v);
}

void results::write_json(const std::string& path) const {
  std::ofstream out(path);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const char* driver = std::getenv("TAGMEM_LIBCUDA");
  char iso_date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(iso_date, sizeof iso_date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  out << "{\n  \"context\": {\"library\": \"tagmem\", \"host_name\": " << json_quoted(host)
      << ", \"driver\": " << json_quoted(driver ? driver : "libcuda.so.1")
      << ", \"date\": " << json_quoted(iso_date) << "},\n  \"benchmarks\": [";
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const result_row& r = rows_[i];
    out << (i ? ",\n" : "\n") << "    {\"name\": " << json_quoted(r.scenario + "/" + r.metric)
        << ", \"run_type\": \"iteration\", \"iterations\": 1, \"scenario\": "
        << json_quoted(r.scenario) << ", \"metric\": " << json_quoted(r.metric)
        << ", \"value\": " << json_value(r.value) << ", \"label\": " << json_quoted(r.note) << "}";
  }
  out << "\n  ]\n}\n";
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace tagmem::bench
