// stress_support.cpp — contexts, random bytes, host buffers and staged copies (see header).
#include "stress_support.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "driver/driver.hpp"

namespace tagmem::stress {

std::uint64_t knob(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

bool using_emulator() {
  const char* lib = std::getenv("TAGMEM_LIBCUDA");
  return lib && std::strstr(lib, "tagmem_emu") != nullptr;
}

void check_cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + driver::describe(r));
  }
}

CUcontext bind_device0() {
  static CUcontext ctx = [] {
    CUdevice dev = 0;
    CUcontext c = nullptr;
    check_cu(driver::api().cuDeviceGet(&dev, 0), "cuDeviceGet");
    check_cu(driver::api().cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
    return c;
  }();
  check_cu(driver::api().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

std::uint64_t fill_random(void* dst, std::size_t n, std::uint64_t seed) {
  auto* out = static_cast<unsigned char*>(dst);
  std::uint64_t x = seed;
  auto next = [&x] {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v = next();
    std::memcpy(out + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<unsigned char>(next());
  return x;
}

host_buffer::host_buffer(std::size_t n) : size_(n) {
  if (n == 0) return;
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<unsigned char*>(p);
}

host_buffer::~host_buffer() {
  if (data_) munmap(data_, size_);
}

host_buffer::host_buffer(host_buffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

host_buffer& host_buffer::operator=(host_buffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

copier::copier(std::size_t staging_bytes) : staging_bytes_(staging_bytes) {
  bind_device0();
  const auto& api = driver::api();
  check_cu(api.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  void* p = nullptr;
  check_cu(api.cuMemHostAlloc(&p, staging_bytes_, 0), "cuMemHostAlloc");
  staging_ = static_cast<unsigned char*>(p);
}

copier::~copier() {
  const auto& api = driver::api();
  bind_device0();
  api.cuStreamSynchronize(stream_);
  api.cuStreamDestroy(stream_);
  api.cuMemFreeHost(staging_);
}

void copier::write(CUdeviceptr dst, const void* src, std::size_t n) {
  const auto& api = driver::api();
  bind_device0();
  for (std::size_t done = 0; done < n;) {
    std::size_t k = std::min(staging_bytes_, n - done);
    std::memcpy(staging_, static_cast<const unsigned char*>(src) + done, k);
    check_cu(api.cuMemcpyHtoDAsync(dst + done, staging_, k, stream_), "cuMemcpyHtoDAsync");
    check_cu(api.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    done += k;
  }
}

std::size_t copier::compare(CUdeviceptr src, const void* expected, std::size_t n) {
  const auto& api = driver::api();
  bind_device0();
  for (std::size_t done = 0; done < n;) {
    std::size_t k = std::min(staging_bytes_, n - done);
    check_cu(api.cuMemcpyDtoHAsync(staging_, src + done, k, stream_), "cuMemcpyDtoHAsync");
    check_cu(api.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    const auto* want = static_cast<const unsigned char*>(expected) + done;
    if (std::memcmp(staging_, want, k) != 0) {
      std::size_t i = 0;
      while (staging_[i] == want[i]) ++i;
      return done + i;
    }
    done += k;
  }
  return n;
}

void copier::memset(CUdeviceptr dst, unsigned char value, std::size_t n) {
  bind_device0();
  check_cu(driver::api().cuMemsetD8Async(dst, value, n, stream_), "cuMemsetD8Async");
  check_cu(driver::api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

std::size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace tagmem::stress
