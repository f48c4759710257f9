// workload.hpp — tensors filled with random bytes that can be checked cheaply and for real.
//
// Every tensor's bytes are a window into one random pattern held in pinned host memory: byte j
// of a tensor is pattern[(offset + j) mod pattern size], with a random offset per tensor. Writing
// is a few large copies from the pattern; checking reads the tensor back and compares every byte
// with the pattern. Changing a tensor picks a new offset and rewrites it, so each phase moves
// fresh data and a stale or misplaced byte cannot pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tagmem::demo {

struct tensor {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::size_t offset = 0;  // into the pattern
};

class pattern_source {
 public:
  explicit pattern_source(std::size_t bytes, std::uint64_t seed);  // pinned; throws on failure
  ~pattern_source();
  pattern_source(const pattern_source&) = delete;
  pattern_source& operator=(const pattern_source&) = delete;

  std::size_t size() const { return size_; }
  std::size_t random_offset() { return rng_() % size_; }
  std::mt19937_64& rng() { return rng_; }

  void write(const tensor& t);  // device <- pattern
  bool check(const tensor& t);  // every byte; false on the first difference
  std::uint64_t bytes_checked() const { return checked_; }

 private:
  unsigned char* pattern_ = nullptr;  // pinned
  unsigned char* staging_ = nullptr;  // pinned, for read-back
  std::size_t size_;
  std::mt19937_64 rng_;
  std::uint64_t checked_ = 0;
};

// Allocates `total` bytes in `tag` as tensors of random sizes around `typical` bytes and fills
// them. Throws std::runtime_error with tagmem's message on failure.
std::vector<tensor> make_tensors(pattern_source& src, const std::string& tag, std::size_t total,
                                 std::size_t typical);

}  // namespace tagmem::demo
