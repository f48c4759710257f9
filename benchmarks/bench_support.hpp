// bench_support.hpp — what the benchmark programs share: command-line knobs, the driver and
// device 0's primary context, pinned host buffers, timing, medians and the results table.
//
// Every program reaches CUDA only through tagmem's driver table (allocator/driver), so the same
// binary runs on the H200 (libcuda.so.1) and on the emulator (TAGMEM_LIBCUDA). Sizes are
// command-line knobs so that the emulator can run them small.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "driver/driver.hpp"

namespace tagmem::bench {

// --key=value arguments; a bare --flag is "1". Unknown keys are an error (the typo guard).
class args {
 public:
  args(int argc, char** argv, std::vector<std::string> known);
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string str(const std::string& key, const std::string& fallback) const;
  double num(const std::string& key, double fallback) const;
  std::size_t bytes(const std::string& key, std::size_t fallback) const;  // 64M, 4G, 1.5G

 private:
  std::map<std::string, std::string> values_;
  std::string error_;
};

// A size as the library reads one (options/size_text.hpp: 1GiB = 2^30, 1GB = 10^9); throws
// std::invalid_argument.
std::size_t parse_bytes(const std::string& text);
std::string format_bytes(std::size_t bytes);  // "16.06 GB (14.96 GiB)"

// Loads the driver and makes device 0's primary context current on the calling thread.
CUcontext use_device0();
bool using_emulator();  // TAGMEM_LIBCUDA names the emulated driver
const driver::table& cu();
#define BENCH_CU(name, ...) ::tagmem::driver::check(::tagmem::bench::cu().name(__VA_ARGS__), #name)

// A pinned host buffer (mmap, huge-page advice, parallel touch, cuMemHostRegister), freed on
// destruction. The benchmarks' own buffers: the pattern, verification staging, raw link.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes);
  ~pinned_buffer();
  pinned_buffer(pinned_buffer&& o) noexcept;
  pinned_buffer& operator=(pinned_buffer&& o) noexcept;
  unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

// Fills [p, p + n) with splitmix64 output of `seed`, on several threads.
void fill_random(unsigned char* p, std::size_t n, std::uint64_t seed);
std::uint64_t mix(std::uint64_t x);  // splitmix64 finaliser

using clock = std::chrono::steady_clock;
inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}
double median(std::vector<double> v);  // NaN for an empty vector

// Host memory a rate is measured through.
struct host_range {
  char* base = nullptr;
  std::size_t size = 0;
};
// Copy rate (GB/s) between a device buffer of `dev_bytes` and every byte of `ranges`, one
// direction: each range in pieces of at most `dev_bytes` on stream `s`, one pass to warm up, the
// median of three timed passes.
double copy_rate(const std::vector<host_range>& ranges, CUdeviceptr dev, std::size_t dev_bytes,
                 bool to_host, CUstream s);

// The rows every program prints last: scenario, metric, value, and a note (ratio, target).
struct result_row {
  std::string scenario, metric, value, note;
};
class results {
 public:
  void add(std::string scenario, std::string metric, std::string value, std::string note = "");
  void print(const std::string& title) const;  // an aligned table on stdout
  // No-op for an empty path. A path ending in ".tsv" also gets the rows as JSON beside it
  // (write_json), so plots and docs read the same data as Google Benchmark's --benchmark_out.
  void write_tsv(const std::string& path) const;
  // {"context": {...}, "benchmarks": [{"name": "scenario/metric", "scenario", "metric",
  // "value" (a number when it is one), "label" (the note), "run_type", "iterations"}]}: the shape
  // of Google Benchmark's JSON output.
  void write_json(const std::string& path) const;

 private:
  std::vector<result_row> rows_;
};
std::string fixed(double v, int digits);

// The non-empty items of a comma-separated list.
std::vector<std::string> split(const std::string& list);

// Sets environment variables for its lifetime (children started meanwhile inherit them), then
// restores what was there.
class env_override {
 public:
  explicit env_override(const std::vector<std::pair<std::string, std::string>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.push_back({name, old ? old : "", old != nullptr});
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~env_override() {
    for (const saved& s : saved_) {
      if (s.was_set) {
        setenv(s.name.c_str(), s.value.c_str(), 1);
      } else {
        unsetenv(s.name.c_str());
      }
    }
  }

 private:
  struct saved {
    std::string name, value;
    bool was_set;
  };
  std::vector<saved> saved_;
};

}  // namespace tagmem::bench
