// stress_support.hpp — what the stress, out-of-memory and soak tests share: the device context,
// fast random bytes, host buffers that go back to the OS, and verified copies.
//
// These tests run unchanged on the emulated driver (TAGMEM_LIBCUDA=libtagmem_emu.so, small sizes,
// label emu) and on a GPU (label gpu, sizes from the environment: tests/stress/gpu_run.sh), so
// they reach device memory only through driver copies. Copies to and from large buffers go
// through a pinned staging buffer, since pageable copies on a GPU run at a tenth of the speed.
// Sizes and counts come from environment knobs with defaults small enough for CI.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tagmem/tagmem.h"

namespace tagmem::stress {

// An integer knob from the environment, or `fallback`.
std::uint64_t knob(const char* name, std::uint64_t fallback);

bool using_emulator();

// Device 0's primary context, retained once and made current on the calling thread.
CUcontext bind_device0();

// Fills `n` bytes at `dst` from a splitmix64 stream seeded with `seed`; returns the next seed.
std::uint64_t fill_random(void* dst, std::size_t n, std::uint64_t seed);

// Host memory from mmap, returned to the OS when destroyed (RSS comparisons stay honest).
class host_buffer {
 public:
  host_buffer() = default;
  explicit host_buffer(std::size_t n);
  ~host_buffer();
  host_buffer(host_buffer&& o) noexcept;
  host_buffer& operator=(host_buffer&& o) noexcept;
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;

  unsigned char* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

// Device copies through a pinned staging buffer on one stream of the caller's own.
class copier {
 public:
  explicit copier(std::size_t staging_bytes = std::size_t{64} << 20);
  ~copier();
  copier(const copier&) = delete;
  copier& operator=(const copier&) = delete;

  void write(CUdeviceptr dst, const void* src, std::size_t n);
  // Compares device bytes with `expected`; returns the offset of the first difference or n.
  std::size_t compare(CUdeviceptr src, const void* expected, std::size_t n);
  void memset(CUdeviceptr dst, unsigned char value, std::size_t n);

 private:
  CUstream stream_ = nullptr;
  unsigned char* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
};

// Throws std::runtime_error naming `what` unless `r` is CUDA_SUCCESS.
void check_cu(CUresult r, const char* what);

// Resident set size of this process.
std::size_t rss_bytes();

}  // namespace tagmem::stress
