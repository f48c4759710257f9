// dataset.hpp — tensors in one tag whose bytes the benchmarks can regenerate and check.
//
// Contents come from a pattern: a pinned buffer of random bytes whose size is deliberately not
// a power of two. Tensor i of generation g holds pattern bytes starting at an offset drawn from
// (i, g) and wrapping around, so every tensor differs from every other one and from its own
// previous generations, and filling it is a few host-to-device copies at link speed.
//
// verify() reads every byte back through pinned staging buffers (double-buffered, outside any
// timed region) and compares it with the pattern, counting mismatching bytes; it also re-reads
// random windows through a separate synchronous path, so a bug in the staging path cannot hide
// one in tagmem. corrupt_one_byte() changes a single device byte so that a run can prove its
// check fails when it should (Note [verify can fail] in scenarios.cpp).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace tagmem::bench {

class pattern {
 public:
  pattern(std::size_t bytes, std::uint64_t seed);
  const unsigned char* data() const { return buf_.data(); }
  std::size_t size() const { return size_; }
  unsigned char at(std::uint64_t pos) const { return buf_.data()[pos % size_]; }

 private:
  pinned_buffer buf_;
  std::size_t size_;
};

struct tensor {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
};

struct verify_report {
  std::uint64_t bytes_checked = 0;
  std::uint64_t bad_bytes = 0;  // full comparison
  std::uint64_t samples = 0;    // windows re-read on the synchronous path
  std::uint64_t bad_samples = 0;
  std::string first_bad;  // where, for the log
  bool ok() const { return bad_bytes == 0 && bad_samples == 0 && bytes_checked > 0; }
};

class dataset {
 public:
  // Allocates `sizes` in `tag` on device 0 (throws std::runtime_error with tagmem's message).
  dataset(std::string tag, const std::vector<std::size_t>& sizes);
  ~dataset();  // frees every tensor
  dataset(const dataset&) = delete;
  dataset& operator=(const dataset&) = delete;

  const std::string& tag() const { return tag_; }
  std::size_t bytes() const { return bytes_; }
  std::size_t count() const { return tensors_.size(); }

  void fill(const pattern& p, std::uint64_t generation);  // synchronous
  verify_report verify(const pattern& p);

  // Flips one byte; restore_byte() puts the right one back.
  void corrupt_one_byte(const pattern& p, std::uint64_t seed);
  void restore_byte(const pattern& p);
  std::size_t corrupted_tensor() const { return bad_tensor_; }
  std::size_t corrupted_offset() const { return bad_offset_; }

 private:
  std::uint64_t start(std::size_t i, const pattern& p) const;
  void set_byte(std::size_t i, std::size_t off, unsigned char v);
  void release() noexcept;  // frees the tensors and the stream

  std::string tag_;
  std::vector<tensor> tensors_;
  std::size_t bytes_ = 0;
  std::uint64_t generation_ = 0;
  CUstream stream_ = nullptr;
  std::size_t bad_tensor_ = 0, bad_offset_ = 0;
};

}  // namespace tagmem::bench
