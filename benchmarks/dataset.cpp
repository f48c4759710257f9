// dataset.cpp — filling and verifying benchmark tensors (see dataset.hpp).
#include "dataset.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "tagmem/tagmem.h"

namespace tagmem::bench {
namespace {

constexpr std::size_t kStaging = 64u << 20;

std::runtime_error tagmem_failure(const std::string& what, tagmem_status s) {
  return std::runtime_error(what + ": " + tagmem_status_string(s) + ": " + tagmem_last_error());
}

// Mismatching bytes of got[0, n) against the pattern from `pos` on; *first gets the offset of
// the first one.
std::uint64_t compare_slice(const unsigned char* got, std::size_t n, const pattern& p,
                            std::uint64_t pos, std::size_t* first) {
  std::uint64_t bad = 0;
  for (std::size_t done = 0; done < n;) {
    std::size_t at = (pos + done) % p.size();
    std::size_t seg = std::min(n - done, p.size() - at);
    if (std::memcmp(got + done, p.data() + at, seg) != 0) {
      for (std::size_t j = 0; j < seg; ++j) {
        if (got[done + j] == p.data()[at + j]) continue;
        if (!bad) *first = done + j;
        ++bad;
      }
    }
    done += seg;
  }
  return bad;
}

// compare_slice over several threads for large buffers.
std::uint64_t compare(const unsigned char* got, std::size_t n, const pattern& p, std::uint64_t pos,
                      std::size_t* first) {
  unsigned t = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  if (n < (8u << 20) || t == 1) return compare_slice(got, n, p, pos, first);
  std::size_t per = (n + t - 1) / t;
  std::vector<std::uint64_t> bad(t, 0);
  std::vector<std::size_t> firsts(t, 0);
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < t && i * per < n; ++i) {
    pool.emplace_back([&, i] {
      std::size_t off = i * per;
      bad[i] = compare_slice(got + off, std::min(per, n - off), p, pos + off, &firsts[i]);
      firsts[i] += off;
    });
  }
  for (auto& th : pool) th.join();
  std::uint64_t total = 0;
  for (unsigned i = 0; i < t; ++i) {
    if (bad[i] && !total) *first = firsts[i];
    total += bad[i];
  }
  return total;
}

pinned_buffer& staging(int which) {
  static std::unique_ptr<pinned_buffer> bufs[2];
  if (!bufs[which]) bufs[which] = std::make_unique<pinned_buffer>(kStaging);
  return *bufs[which];
}

}  // namespace

pattern::pattern(std::size_t bytes, std::uint64_t seed) : buf_(bytes), size_(bytes) {
  fill_random(buf_.data(), size_, seed);
}

dataset::dataset(std::string tag, const std::vector<std::size_t>& sizes) : tag_(std::move(tag)) {
  use_device0();
  BENCH_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
  tensors_.reserve(sizes.size());
  for (std::size_t n : sizes) {
    void* p = nullptr;
    tagmem_status s = tagmem_malloc_tagged(&p, n, tag_.c_str(), 0, nullptr);
    if (s != TAGMEM_SUCCESS) {
      auto e = tagmem_failure("allocating " + std::to_string(n) + " bytes in " + tag_, s);
      release();
      throw e;
    }
    tensors_.push_back({reinterpret_cast<CUdeviceptr>(p), n});
    bytes_ += n;
  }
}

dataset::~dataset() { release(); }

void dataset::release() noexcept {
  for (const tensor& t : tensors_) tagmem_free(reinterpret_cast<void*>(t.ptr), nullptr);
  tensors_.clear();
  if (stream_) cu().cuStreamDestroy(stream_);
  stream_ = nullptr;
}

std::uint64_t dataset::start(std::size_t i, const pattern& p) const {
  return mix(i * 0x9e3779b97f4a7c15ull ^ mix(generation_ + 12345)) % p.size();
}

void dataset::fill(const pattern& p, std::uint64_t generation) {
  use_device0();
  generation_ = generation;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const tensor& t = tensors_[i];
    std::uint64_t pos = start(i, p);
    for (std::size_t done = 0; done < t.bytes;) {
      std::size_t at = (pos + done) % p.size();
      std::size_t n = std::min(t.bytes - done, p.size() - at);
      BENCH_CU(cuMemcpyHtoDAsync, t.ptr + done, p.data() + at, n, stream_);
      done += n;
    }
  }
  BENCH_CU(cuStreamSynchronize, stream_);
}

verify_report dataset::verify(const pattern& p) {
  use_device0();
  verify_report rep;
  CUevent ev[2] = {nullptr, nullptr};
  BENCH_CU(cuEventCreate, &ev[0], CU_EVENT_DISABLE_TIMING);
  BENCH_CU(cuEventCreate, &ev[1], CU_EVENT_DISABLE_TIMING);
  struct job {
    std::size_t tensor, offset, bytes;
  };
  job pending[2];
  auto check = [&](int b) {
    BENCH_CU(cuEventSynchronize, ev[b]);
    const job& j = pending[b];
    std::size_t first = 0;
    std::uint64_t bad =
        compare(staging(b).data(), j.bytes, p, start(j.tensor, p) + j.offset, &first);
    if (bad && rep.first_bad.empty()) {
      rep.first_bad = "tensor " + std::to_string(j.tensor) + " offset " +
                      std::to_string(j.offset + first) + " (full comparison)";
    }
    rep.bad_bytes += bad;
    rep.bytes_checked += j.bytes;
  };
  // Double-buffered: the copy of piece k overlaps the comparison of piece k-1.
  std::size_t k = 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    for (std::size_t off = 0; off < tensors_[i].bytes; off += kStaging, ++k) {
      int b = k % 2;
      std::size_t n = std::min(kStaging, tensors_[i].bytes - off);
      BENCH_CU(cuMemcpyDtoHAsync, staging(b).data(), tensors_[i].ptr + off, n, stream_);
      BENCH_CU(cuEventRecord, ev[b], stream_);
      pending[b] = {i, off, n};
      if (k) check(1 - b);
    }
  }
  if (k) check((k - 1) % 2);
  cu().cuEventDestroy(ev[0]);
  cu().cuEventDestroy(ev[1]);

  // The synchronous path: random windows read one by one.
  std::uint64_t seed = mix(generation_ ^ 0xabcdef);
  rep.samples = std::min<std::size_t>(tensors_.size(), 64 + tensors_.size() / 50);
  std::vector<unsigned char> got;
  for (std::uint64_t s = 0; s < rep.samples; ++s) {
    std::size_t i = mix(seed + 2 * s) % tensors_.size();
    std::size_t w = std::min<std::size_t>(4096, tensors_[i].bytes);
    std::size_t off = mix(seed + 2 * s + 1) % (tensors_[i].bytes - w + 1);
    got.resize(w);
    BENCH_CU(cuMemcpyDtoH, got.data(), tensors_[i].ptr + off, w);
    std::size_t first = 0;
    if (compare_slice(got.data(), w, p, start(i, p) + off, &first)) {
      ++rep.bad_samples;
      if (rep.first_bad.empty()) {
        rep.first_bad =
            "tensor " + std::to_string(i) + " offset " + std::to_string(off + first) + " (sample)";
      }
    }
  }
  return rep;
}

void dataset::set_byte(std::size_t i, std::size_t off, unsigned char v) {
  use_device0();
  BENCH_CU(cuMemsetD8Async, tensors_[i].ptr + off, v, 1, stream_);
  BENCH_CU(cuStreamSynchronize, stream_);
}

void dataset::corrupt_one_byte(const pattern& p, std::uint64_t seed) {
  bad_tensor_ = mix(seed) % tensors_.size();
  bad_offset_ = mix(seed + 1) % tensors_[bad_tensor_].bytes;
  set_byte(bad_tensor_, bad_offset_, p.at(start(bad_tensor_, p) + bad_offset_) ^ 0xa5);
}

void dataset::restore_byte(const pattern& p) {
  set_byte(bad_tensor_, bad_offset_, p.at(start(bad_tensor_, p) + bad_offset_));
}

}  // namespace tagmem::bench
