// runtime_test.cpp — the cudaMalloc/cudaFree interposers, over a stand-in for a dynamically
// linked CUDA runtime (fake_cudart.c): inside a tag scope (or with TAGMEM_PRELOAD_TAG) memory
// comes from tagmem and survives offload/reload at the same address; otherwise the runtime's
// own function serves it untouched. cudaFree and cudaFreeAsync keep CUDA's ordering against
// work still queued on other streams.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "nccl_way.hpp"
#include "tagmem/tagmem.h"

extern "C" {
int cudaMalloc(void** ptr, size_t size);
int cudaMallocAsync(void** ptr, size_t size, void* stream);
int cudaFree(void* ptr);
int cudaFreeAsync(void* ptr, void* stream);
std::uint64_t tagmem_fake_cudart_calls(void);
}

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

// tagmem's C ABI, exported by the preloaded shim.
struct api {
  template <class F>
  static F get(const char* name) {
    return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  }
  decltype(&::tagmem_push_tag) push = get<decltype(&::tagmem_push_tag)>("tagmem_push_tag");
  decltype(&::tagmem_pop_tag) pop = get<decltype(&::tagmem_pop_tag)>("tagmem_pop_tag");
  decltype(&::tagmem_pointer_info) info =
      get<decltype(&::tagmem_pointer_info)>("tagmem_pointer_info");
  decltype(&::tagmem_offload) offload = get<decltype(&::tagmem_offload)>("tagmem_offload");
  decltype(&::tagmem_reload) reload = get<decltype(&::tagmem_reload)>("tagmem_reload");
  decltype(&::tagmem_tag_stats_get_sized) tag_stats =
      get<decltype(&::tagmem_tag_stats_get_sized)>("tagmem_tag_stats_get_sized");
  decltype(&::tagmem_wait_released) wait_released =
      get<decltype(&::tagmem_wait_released)>("tagmem_wait_released");
};
const api& tm() {
  static api a;
  return a;
}

std::string tag_of(void* p) {
  char tag[TAGMEM_MAX_TAG_NAME + 1] = {};
  if (tm().info(p, tag, sizeof tag, nullptr, nullptr, nullptr) != TAGMEM_SUCCESS) return "";
  return tag;
}

buffer view(void* p, std::size_t size) {
  buffer b;
  b.va = reinterpret_cast<CUdeviceptr>(p);
  b.size = size;
  return b;
}

class Runtime : public ::testing::Test {
 protected:
  void SetUp() override {
    use_device(0);
    ASSERT_EQ(std::getenv("TAGMEM_PRELOAD_TAG"), nullptr) << "run RuntimeDefaultTag.* for that";
  }
};

TEST_F(Runtime, OutsideAScopeCudaMallocPassesThroughToTheRuntime) {
  std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 1);
  EXPECT_EQ(tag_of(p), "") << "not tagmem's";
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 2);
}

TEST_F(Runtime, InsideAScopeCudaMallocAndFreeGoToTagmem) {
  std::uint64_t calls = tagmem_fake_cudart_calls();
  ASSERT_EQ(tm().push("rt-scope"), TAGMEM_SUCCESS);
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 * MiB), 0);
  ASSERT_EQ(cudaMallocAsync(&q, MiB, nullptr), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(tag_of(p), "rt-scope");
  EXPECT_EQ(tag_of(q), "rt-scope");
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 256), 1) << "an interior pointer is invalid";
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(cudaFreeAsync(q, nullptr), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls) << "the runtime saw none of these";
  tagmem_tag_stats st{};
  ASSERT_EQ(tm().tag_stats("rt-scope", 0, &st, sizeof st), TAGMEM_SUCCESS);
  EXPECT_EQ(st.alloc_count, 2u);
  EXPECT_EQ(st.free_count, 2u);
  EXPECT_EQ(st.live_allocations, 0u);
}

TEST_F(Runtime, OffloadAndReloadKeepValuesAndAddresses) {
  ASSERT_EQ(tm().push("rt-offload"), TAGMEM_SUCCESS);
  std::vector<void*> ptrs(3);
  std::vector<std::size_t> sizes = {MiB, 5 * MiB, 300 << 10};
  for (std::size_t i = 0; i < ptrs.size(); ++i) ASSERT_EQ(cudaMalloc(&ptrs[i], sizes[i]), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    write_bytes(view(ptrs[i], sizes[i]), 0, pattern(40 + i, sizes[i]));
  const char* tags[] = {"rt-offload"};
  ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  for (void* p : ptrs) EXPECT_FALSE(readable(reinterpret_cast<CUdeviceptr>(p)));
  ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    EXPECT_EQ(read_bytes(view(ptrs[i], sizes[i]), 0, sizes[i]), pattern(40 + i, sizes[i]));
    EXPECT_EQ(cudaFree(ptrs[i]), 0);
  }
}

TEST_F(Runtime, CudaMallocInAnOffloadedTagIsOutOfMemory) {
  ASSERT_EQ(tm().push("rt-gone"), TAGMEM_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0);
  const char* tags[] = {"rt-gone"};
  ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS);
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, MiB), 2) << "cudaErrorMemoryAllocation";
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
  EXPECT_EQ(cudaFree(p), 0);
  // The discarded memory goes back to the driver on a background thread; later tests in this
  // process count the driver's live allocations, so it must be back before this test ends.
  EXPECT_EQ(tm().wait_released(0), TAGMEM_SUCCESS);
}

// CUDA's cudaMalloc answers a size larger than the device with cudaErrorMemoryAllocation, which
// PyTorch turns into OutOfMemoryError; a size the runtime rejects outright stays invalid.
TEST_F(Runtime, CudaMallocLargerThanTheDeviceIsOutOfMemory) {
  ASSERT_EQ(tm().push("rt-huge"), TAGMEM_SUCCESS);
  const std::size_t device_bytes = emu_device_bytes(0);
  for (std::size_t size : {device_bytes + 1, 2 * device_bytes, std::size_t{1} << 50}) {
    void* p = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(cudaMalloc(&p, size), 2) << size << " bytes: cudaErrorMemoryAllocation";
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(cudaMallocAsync(&p, size, nullptr), 2) << size << " bytes";
  }
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0) << "the tag still serves what fits";
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(cudaFree(p), 0);
}

// Note [queued writer]: a non-blocking stream with many slowed copies queued, each writing
// `old` over the whole allocation — PyTorch's side-stream kernels still running when their
// tensor is freed. It is not ordered with the legacy default stream.
class queued_writer {
 public:
  queued_writer(void* dst, std::size_t size, std::uint64_t seed) : old_(pattern(seed, size)) {
    check(nccl().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    emu_set_copy_bytes_per_second(256 * MiB);  // each copy then keeps the stream busy a while
    for (int i = 0; i < kCopies; ++i) {
      check(
          nccl().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), old_.data(), size, stream_),
          "cuMemcpyHtoDAsync");
    }
  }
  ~queued_writer() {
    nccl().cuStreamSynchronize(stream_);
    nccl().cuStreamDestroy(stream_);
    emu_set_copy_bytes_per_second(0);
  }
  queued_writer(const queued_writer&) = delete;
  queued_writer& operator=(const queued_writer&) = delete;

  CUstream stream() const { return stream_; }
  void finish() { check(nccl().cuStreamSynchronize(stream_), "cuStreamSynchronize"); }

 private:
  static constexpr int kCopies = 16;
  static void check(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(call) + ": " + std::to_string(r));
  }
  std::vector<unsigned char> old_;
  CUstream stream_ = nullptr;
};

std::size_t differing_bytes(const std::vector<unsigned char>& a,
                            const std::vector<unsigned char>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Note [cudaFree waits] in runtime_hooks.cpp.
TEST_F(Runtime, CudaFreeWaitsForOtherStreamsBeforeCudaMallocReusesTheMemory) {
  constexpr std::size_t size = 8 * MiB;
  ASSERT_EQ(tm().push("rt-free-order"), TAGMEM_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, size), 0);
  void* q = nullptr;
  const auto fresh = pattern(61, size);
  std::vector<unsigned char> seen;
  {
    queued_writer old_work(p, size, 60);
    ASSERT_EQ(cudaFree(p), 0);
    ASSERT_EQ(cudaMalloc(&q, size), 0);
    ASSERT_EQ(q, p) << "the freed block must be the one reused, or this checks nothing";
    write_bytes(view(q, size), 0, fresh);  // legacy default stream, like PyTorch's new tensor
    old_work.finish();
    seen = read_bytes(view(q, size), 0, size);
  }
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(differing_bytes(seen, fresh), 0u)
      << "bytes of the new allocation overwritten by work queued before cudaFree";
  EXPECT_EQ(cudaFree(q), 0);
}

TEST_F(Runtime, CudaFreeAsyncIsOrderedOnItsStream) {
  constexpr std::size_t size = 8 * MiB;
  ASSERT_EQ(tm().push("rt-free-async"), TAGMEM_SUCCESS);
  CUstream other = nullptr;
  ASSERT_EQ(nccl().cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* p = nullptr;
  void* q = nullptr;
  const auto fresh = pattern(63, size);
  std::vector<unsigned char> seen;
  {
    void* first = nullptr;
    ASSERT_EQ(cudaMallocAsync(&first, size, nullptr), 0);  // the writer's stream is made below
    queued_writer old_work(first, size, 62);
    p = first;
    ASSERT_EQ(cudaFreeAsync(p, old_work.stream()), 0);
    ASSERT_EQ(cudaMallocAsync(&q, size, other), 0);
    ASSERT_EQ(q, p) << "the freed block must be the one reused, or this checks nothing";
    ASSERT_EQ(nccl().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(q), fresh.data(), size, other),
              CUDA_SUCCESS);
    ASSERT_EQ(nccl().cuStreamSynchronize(other), CUDA_SUCCESS);
    old_work.finish();
    seen = read_bytes(view(q, size), 0, size);
  }
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(differing_bytes(seen, fresh), 0u)
      << "the other stream must wait for the freeing stream's earlier work";
  EXPECT_EQ(cudaFreeAsync(q, other), 0);
  EXPECT_EQ(nccl().cuStreamSynchronize(other), CUDA_SUCCESS);
  EXPECT_EQ(nccl().cuStreamDestroy(other), CUDA_SUCCESS);
}

TEST_F(Runtime, CudaFreeWhoseDeviceWaitFailsReturnsTheErrorAndKeepsTheMemory) {
  ASSERT_EQ(tm().push("rt-free-error"), TAGMEM_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  const auto bytes = pattern(64, MiB);
  write_bytes(view(p, MiB), 0, bytes);
  emu_fail_call("cuCtxSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(cudaFree(p), 719) << "cudaErrorLaunchFailure, an earlier kernel's error";
  emu_clear_faults();  // had cudaFree not waited, the fault would hit a later test
  EXPECT_EQ(tag_of(p), "rt-free-error") << "not freed: the device may still use it";
  EXPECT_EQ(read_bytes(view(p, MiB), 0, MiB), bytes);
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(tag_of(p), "");
}

TEST(RuntimeDefaultTag, EveryCudaMallocGoesToTheDefaultTagUnlessAScopeSaysOtherwise) {
  const char* tag = std::getenv("TAGMEM_PRELOAD_TAG");
  ASSERT_NE(tag, nullptr) << "this test runs with TAGMEM_PRELOAD_TAG set (ctest does that)";
  use_device(0);
  std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 2 * MiB), 0);
  EXPECT_EQ(tag_of(p), tag);
  ASSERT_EQ(tm().push("scoped"), TAGMEM_SUCCESS);
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&q, MiB), 0);
  ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(tag_of(q), "scoped");
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls);
  write_bytes(view(p, 2 * MiB), 0, pattern(5, 2 * MiB));
  const char* tags[] = {tag};
  ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
  EXPECT_EQ(read_bytes(view(p, 2 * MiB), 0, 2 * MiB), pattern(5, 2 * MiB));
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(cudaFree(q), 0);
  void* none = nullptr;
  EXPECT_EQ(cudaMalloc(&none, 0), 0) << "size 0 is the runtime's business";
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 1);
}

}  // namespace
}  // namespace tagmem::preload_test
