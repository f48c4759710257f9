// thread_exit_test.cpp — cudaFree through the shim from a thread's exit destructors (a C++
// thread_local made before the thread's first call, a pthread key destructor of a thread that
// never called tagmem before): every free succeeds and the memory left alive keeps its bytes
// (Note [heap at thread exit] in allocator/host/metadata_heap.cpp).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "nccl_way.hpp"
#include "tagmem/tagmem.h"

extern "C" {
int cudaMalloc(void** ptr, size_t size);
int cudaFree(void* ptr);
}

namespace tagmem::preload_test {
namespace {

template <class F>
F api(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

struct allocation {
  void* ptr;
  std::vector<unsigned char> bytes;
};

buffer view(const allocation& a) {
  buffer b;
  b.va = reinterpret_cast<CUdeviceptr>(a.ptr);
  b.size = a.bytes.size();
  return b;
}

// Allocations in tag "shim-exit" through cudaMalloc, each filled with random bytes.
std::vector<allocation> allocate(std::mt19937_64& rng, int count) {
  auto push = api<decltype(&::tagmem_push_tag)>("tagmem_push_tag");
  auto pop = api<decltype(&::tagmem_pop_tag)>("tagmem_pop_tag");
  std::vector<allocation> out;
  EXPECT_EQ(push("shim-exit"), TAGMEM_SUCCESS);
  for (int i = 0; i < count; ++i) {
    const std::size_t size = 1 + rng() % (i % 3 ? 60000 : (2u << 20));
    allocation a{nullptr, pattern(rng(), size)};
    EXPECT_EQ(cudaMalloc(&a.ptr, size), 0);
    write_bytes(view(a), 0, a.bytes);
    out.push_back(std::move(a));
  }
  EXPECT_EQ(pop(), TAGMEM_SUCCESS);
  return out;
}

std::vector<void*> g_to_free;
std::atomic<int> g_failures{0};
std::atomic<int> g_freed{0};

void free_all_listed() {
  for (void* p : g_to_free) {
    if (cudaFree(p) != 0) ++g_failures;
    ++g_freed;
  }
  g_to_free.clear();
}

struct tls_freer {
  ~tls_freer() { free_all_listed(); }
};

void key_destructor(void*) { free_all_listed(); }

// The half of `all` that the destructor frees goes to g_to_free; the rest is checked and freed.
void check_rest(std::vector<allocation>& all, std::size_t freed_by_destructor) {
  EXPECT_EQ(g_failures.load(), 0);
  EXPECT_EQ(std::size_t(g_freed.load()), freed_by_destructor);
  for (std::size_t i = 0; i < all.size(); i += 2) {
    EXPECT_EQ(read_bytes(view(all[i]), 0, all[i].bytes.size()), all[i].bytes) << i;
    EXPECT_EQ(cudaFree(all[i].ptr), 0);
  }
  auto stats = api<decltype(&::tagmem_tag_stats_get_sized)>("tagmem_tag_stats_get_sized");
  tagmem_tag_stats st{};
  ASSERT_EQ(stats("shim-exit", 0, &st, sizeof st), TAGMEM_SUCCESS);
  EXPECT_EQ(st.allocated_bytes, 0u);
}

std::size_t hand_odd_ones(const std::vector<allocation>& all) {
  g_to_free.clear();
  g_failures = 0;
  g_freed = 0;
  for (std::size_t i = 1; i < all.size(); i += 2) g_to_free.push_back(all[i].ptr);
  return g_to_free.size();
}

TEST(ShimThreadExit, CudaFreeFromAThreadLocalMadeBeforeTheFirstCall) {
  use_device(0);
  std::mt19937_64 rng(std::random_device{}());
  std::vector<allocation> all;
  std::size_t n = 0;
  std::thread t([&] {
    thread_local tls_freer freer;  // destroyed after tagmem's own thread_local
    (void)freer;
    use_device(0);
    all = allocate(rng, 12);
    n = hand_odd_ones(all);
  });
  t.join();
  check_rest(all, n);
}

TEST(ShimThreadExit, CudaFreeFromTheKeyDestructorOfAThreadThatNeverCalledTagmem) {
  use_device(0);
  std::mt19937_64 rng(std::random_device{}());
  std::vector<allocation> all = allocate(rng, 12);
  const std::size_t n = hand_odd_ones(all);
  pthread_key_t key;
  ASSERT_EQ(pthread_key_create(&key, key_destructor), 0);
  std::thread t([&] { pthread_setspecific(key, &key); });
  t.join();
  pthread_key_delete(key);
  check_rest(all, n);
}

}  // namespace
}  // namespace tagmem::preload_test
