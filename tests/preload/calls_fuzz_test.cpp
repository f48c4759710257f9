// calls_fuzz_test.cpp — random sequences of the calls a process makes through the shim, from
// several threads at once: cudaMalloc and cudaMallocAsync inside and outside tag scopes, with the
// thread's routing switched on and off, cudaFree and cudaFreeAsync (also of interior pointers),
// allocations no device can hold, offload and reload of the thread's tag, NCCL-style buffers
// through the wrapped driver entry points, export and import of their POSIX descriptors, and
// switches of the current context between the devices. Every allocation holds random bytes that
// are checked exactly whenever they could have been disturbed and before they are freed; every
// call's result is the one CUDA would give.
//
// Each thread draws its steps from its own generator, seeded from TAGMEM_CALLS_FUZZ_SEED (else a
// fresh seed, printed on failure) and the thread's index; TAGMEM_CALLS_FUZZ_STEPS sets the steps
// per thread (default 150). tests/sanitizers.sh runs it with more steps in its ASan+UBSan and
// TSan trees (docs/reliability.md).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nccl_way.hpp"
#include "tagmem/tagmem.h"
#include "tagmem/tagmem_preload.h"

extern "C" {
int cudaMalloc(void** ptr, size_t size);
int cudaMallocAsync(void** ptr, size_t size, void* stream);
int cudaFree(void* ptr);
int cudaFreeAsync(void* ptr, void* stream);
}

namespace tagmem::preload_test {
namespace {

constexpr int kThreads = 4;
constexpr std::size_t kMaxLive = 6;
// cudaError_t values the interposers return.
constexpr int kSuccess = 0, kInvalidValue = 1, kMemoryAllocation = 2;

template <class F>
F shim_fn(const char* name) {
  auto f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  if (!f) std::abort();  // main() refused to run without the shim
  return f;
}

struct api {
  decltype(&::tagmem_push_tag) push = shim_fn<decltype(push)>("tagmem_push_tag");
  decltype(&::tagmem_pop_tag) pop = shim_fn<decltype(pop)>("tagmem_pop_tag");
  decltype(&::tagmem_pointer_info) info = shim_fn<decltype(info)>("tagmem_pointer_info");
  decltype(&::tagmem_offload) offload = shim_fn<decltype(offload)>("tagmem_offload");
  decltype(&::tagmem_reload) reload = shim_fn<decltype(reload)>("tagmem_reload");
  decltype(&::tagmem_tag_stats_get_sized) tag_stats =
      shim_fn<decltype(tag_stats)>("tagmem_tag_stats_get_sized");
  decltype(&::tagmem_last_error) last_error = shim_fn<decltype(last_error)>("tagmem_last_error");
  decltype(&::tagmem_preload_set_thread_routing) route =
      shim_fn<decltype(route)>("tagmem_preload_set_thread_routing");
};
const api& tm() {
  static api a;
  return a;
}

std::string owner(void* p) {
  char name[TAGMEM_MAX_TAG_NAME + 1] = {};
  return tm().info(p, name, sizeof name, nullptr, nullptr, nullptr) == TAGMEM_SUCCESS ? name : "";
}

buffer span(void* p, std::size_t size) {
  buffer b;
  b.va = reinterpret_cast<CUdeviceptr>(p);
  b.size = size;
  return b;
}

std::uint64_t env_number(const char* name, std::uint64_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : otherwise;
}

// One runtime allocation: where it went and what it holds.
struct block {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::string tag;  // "" for the runtime's own memory
  std::vector<unsigned char> bytes;
};

// One NCCL-style buffer with its bytes.
struct nccl_block {
  buffer b;
  std::vector<unsigned char> bytes;
};

class caller {
 public:
  caller(int index, std::uint64_t seed)
      : index_(index),
        seed_(seed),
        rng_(seed * 1000003u + index),
        tag_("calls-fuzz-" + std::to_string(index)) {}

  void run(std::uint64_t steps) {
    use_device(0);
    ASSERT_EQ(nccl().cuStreamCreate(&stream_, 0), CUDA_SUCCESS);
    for (std::uint64_t i = 0; i < steps && !::testing::Test::HasFatalFailure(); ++i) step(i);
    while (!blocks_.empty()) free_one(pick(blocks_.size()), rng_() % 2 == 0);
    for (nccl_block& n : nccl_) drop_nccl(n);
    nccl_.clear();
    EXPECT_EQ(nccl().cuStreamSynchronize(stream_), CUDA_SUCCESS);
    EXPECT_EQ(nccl().cuStreamDestroy(stream_), CUDA_SUCCESS);
    tagmem_tag_stats st{};
    if (tm().tag_stats(tag_.c_str(), 0, &st, sizeof st) == TAGMEM_SUCCESS) {
      EXPECT_EQ(st.live_allocations, 0u) << tag_;
    }
  }

 private:
  std::size_t pick(std::size_t n) { return rng_() % n; }

  std::size_t size() {
    static const std::size_t sizes[] = {1, 255, 4096, 100003, (1u << 20) + 3, 2u << 20};
    return sizes[pick(std::size(sizes))];
  }

  void* stream() { return rng_() % 2 ? static_cast<void*>(stream_) : nullptr; }

  // A runtime allocation through the interposers, in `tag` ("" outside any scope), filled.
  void allocate(const std::string& scope, bool async, const std::string& expected_tag) {
    if (blocks_.size() >= kMaxLive) return;
    block b;
    b.size = size();
    if (!scope.empty()) {
      ASSERT_EQ(tm().push(scope.c_str()), TAGMEM_SUCCESS);
    }
    int r = async ? cudaMallocAsync(&b.ptr, b.size, stream()) : cudaMalloc(&b.ptr, b.size);
    if (!scope.empty()) {
      ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
    }
    ASSERT_EQ(r, kSuccess) << "cudaMalloc" << (async ? "Async" : "") << "(" << b.size << ")";
    b.tag = expected_tag;
    EXPECT_EQ(owner(b.ptr), expected_tag) << "where the allocation went";
    if (async) {  // stream-ordered: the bytes are written after the stream's work
      ASSERT_EQ(nccl().cuStreamSynchronize(stream_), CUDA_SUCCESS);
    }
    b.bytes = pattern(rng_(), b.size);
    write_bytes(span(b.ptr, b.size), 0, b.bytes);
    blocks_.push_back(std::move(b));
  }

  void expect_intact(const block& b, const char* when) {
    EXPECT_EQ(read_bytes(span(b.ptr, b.size), 0, b.size), b.bytes)
        << when << ": " << b.size << " bytes at " << b.ptr << " in '" << b.tag << "'";
  }

  void free_one(std::size_t i, bool async) {
    block b = std::move(blocks_[i]);
    blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
    expect_intact(b, "before its free");
    EXPECT_EQ(async ? cudaFreeAsync(b.ptr, stream()) : cudaFree(b.ptr), kSuccess);
  }

  void drop_nccl(nccl_block& n) {
    EXPECT_EQ(read_bytes(n.b, 0, n.b.size), n.bytes) << "NCCL-style buffer before its free";
    free_buffer(n.b);
  }

  void step(std::uint64_t i) {
    SCOPED_TRACE("TAGMEM_CALLS_FUZZ_SEED=" + std::to_string(seed_) + ", thread " +
                 std::to_string(index_) + ", step " + std::to_string(i));
    try {
      one_step();
    } catch (const std::exception& e) {  // a driver call of the test's own helpers failed
      FAIL() << e.what();
    }
  }

  void one_step() {
    switch (rng_() % 12) {
      case 0:
      case 1:  // inside a scope: tagmem's, in the scope's tag
        allocate(tag_, rng_() % 2, tag_);
        break;
      case 2:  // outside: the runtime's
        allocate("", rng_() % 2, "");
        break;
      case 3: {  // routing switched on outside a scope, off inside one
        const bool on = rng_() % 2;
        const int before = tm().route(on ? TAGMEM_PRELOAD_ROUTE_ON : TAGMEM_PRELOAD_ROUTE_OFF);
        allocate(on ? "" : tag_, false, on ? TAGMEM_DEFAULT_TAG : "");
        tm().route(before);
        break;
      }
      case 4:
      case 5:
        if (!blocks_.empty()) free_one(pick(blocks_.size()), rng_() % 2);
        break;
      case 6: {  // an interior pointer of tagmem's is refused and frees nothing
        for (block& b : blocks_) {
          if (b.tag.empty() || b.size < 2) continue;
          EXPECT_EQ(cudaFree(static_cast<char*>(b.ptr) + 1 + pick(b.size - 1)), kInvalidValue);
          expect_intact(b, "after a refused interior free");
          break;
        }
        break;
      }
      case 7: {  // more than the device holds (within the tag's address range): out of memory
        void* p = reinterpret_cast<void*>(0x1);
        ASSERT_EQ(tm().push(tag_.c_str()), TAGMEM_SUCCESS);
        EXPECT_EQ(cudaMalloc(&p, std::size_t{1} << 37), kMemoryAllocation) << tm().last_error();
        ASSERT_EQ(tm().pop(), TAGMEM_SUCCESS);
        break;
      }
      case 8: {  // the thread's tag offloaded and reloaded: same addresses, same bytes
        const char* tags[] = {tag_.c_str()};
        bool any = false;
        for (const block& b : blocks_) any |= b.tag == tag_;
        if (!any) break;
        ASSERT_EQ(tm().offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
        ASSERT_EQ(tm().reload(tags, 1, 0), TAGMEM_SUCCESS);
        for (const block& b : blocks_) expect_intact(b, "after offload and reload");
        break;
      }
      case 9:  // an NCCL-style buffer through the wrapped driver entry points
        if (nccl_.size() < 2) {
          nccl_block n;
          n.b = create_buffer(0, (2u << 20) * (1 + pick(2)), true);  // granularity: 2 MiB
          n.bytes = pattern(rng_(), n.b.size);
          write_bytes(n.b, 0, n.bytes);
          nccl_.push_back(std::move(n));
        } else {
          drop_nccl(nccl_.front());
          nccl_.erase(nccl_.begin());
        }
        break;
      case 10:  // its descriptor exported and imported again: the same memory, mapped twice
        if (!nccl_.empty()) {
          nccl_block& n = nccl_[pick(nccl_.size())];
          int fd = export_fd(n.b);
          buffer again = import_buffer(0, fd, n.b.size);
          ::close(fd);
          EXPECT_EQ(read_bytes(again, 0, again.size), n.bytes) << "the import";
          free_buffer(again);
        }
        break;
      case 11:  // freed while another device's context is current (bytes checked from device 0's)
        if (!blocks_.empty()) {
          const std::size_t i = pick(blocks_.size());
          expect_intact(blocks_[i], "before its free");
          use_device(1);
          EXPECT_EQ(cudaFree(blocks_[i].ptr), kSuccess);
          use_device(0);
          blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
    }
  }

  int index_;
  std::uint64_t seed_;
  std::mt19937_64 rng_;
  std::string tag_;
  CUstream stream_ = nullptr;
  std::vector<block> blocks_;
  std::vector<nccl_block> nccl_;
};

TEST(CallsFuzz, ThreadsMixingRuntimeAndDriverCallsKeepEveryByte) {
  const std::uint64_t seed = env_number("TAGMEM_CALLS_FUZZ_SEED", std::random_device()());
  const std::uint64_t steps = env_number("TAGMEM_CALLS_FUZZ_STEPS", 150);
  SCOPED_TRACE("TAGMEM_CALLS_FUZZ_SEED=" + std::to_string(seed));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, seed, steps] {
      try {
        caller(t, seed).run(steps);
      } catch (const std::exception& e) {  // a driver call of the test's own helpers failed
        ADD_FAILURE() << "thread " << t << ": " << e.what();
      }
    });
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace tagmem::preload_test
