// workload.cpp — random-pattern tensors: fill, check, allocate (see workload.hpp).
#include "workload.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "cuda_calls.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::demo {

pattern_source::pattern_source(std::size_t bytes, std::uint64_t seed) : size_(bytes), rng_(seed) {
  void* p = nullptr;
  check_cuda(cuda().host_alloc(&p, size_, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
  pattern_ = static_cast<unsigned char*>(p);
  check_cuda(cuda().host_alloc(&p, size_, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
  staging_ = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i + 8 <= size_; i += 8) {
    std::uint64_t x = rng_();
    std::memcpy(pattern_ + i, &x, 8);
  }
}

pattern_source::~pattern_source() {
  cuda().free_host(pattern_);
  cuda().free_host(staging_);
}

void pattern_source::write(const tensor& t) {
  std::size_t done = 0;
  while (done < t.size) {
    std::size_t at = (t.offset + done) % size_;
    std::size_t n = std::min(t.size - done, size_ - at);
    check_cuda(cuda().copy_to_device(reinterpret_cast<CUdeviceptr>(t.ptr) + done, pattern_ + at, n),
               "cuMemcpyHtoD");
    done += n;
  }
}

bool pattern_source::check(const tensor& t) {
  std::size_t done = 0;
  while (done < t.size) {
    std::size_t n = std::min(t.size - done, size_);
    check_cuda(cuda().copy_to_host(staging_, reinterpret_cast<CUdeviceptr>(t.ptr) + done, n),
               "cuMemcpyDtoH");
    // Compare the staged window with the pattern, which may wrap around once.
    std::size_t at = (t.offset + done) % size_;
    std::size_t first = std::min(n, size_ - at);
    if (std::memcmp(staging_, pattern_ + at, first) != 0) return false;
    if (first < n && std::memcmp(staging_ + first, pattern_, n - first) != 0) return false;
    done += n;
    checked_ += n;
  }
  return true;
}

std::vector<tensor> make_tensors(pattern_source& src, const std::string& tag, std::size_t total,
                                 std::size_t typical) {
  std::vector<tensor> out;
  std::size_t have = 0;
  std::uniform_real_distribution<double> scale(0.25, 1.75);
  while (have < total) {
    tensor t;
    t.size = std::min(total - have, std::max<std::size_t>(
                                        256, static_cast<std::size_t>(typical * scale(src.rng()))));
    t.offset = src.random_offset();
    tagmem_status s = tagmem_malloc_tagged(&t.ptr, t.size, tag.c_str(), 0, nullptr);
    if (s != TAGMEM_SUCCESS) {
      throw std::runtime_error("allocating in '" + tag + "': " + tagmem_last_error());
    }
    src.write(t);
    out.push_back(t);
    have += t.size;
  }
  return out;
}

}  // namespace tagmem::demo
