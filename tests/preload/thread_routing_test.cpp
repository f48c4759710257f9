// thread_routing_test.cpp — tagmem_preload_set_thread_routing(): one thread switches its own
// runtime allocations to tagmem or away from it, whatever its scopes say, and other threads keep
// their own decision; with TMS_INIT_ENABLE=1 (torch_memory_saver's variable) every allocation
// goes to the "default" tag unless the thread switched routing off.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "nccl_way.hpp"
#include "tagmem/tagmem.h"
#include "tagmem/tagmem_preload.h"

extern "C" {
int cudaMalloc(void** ptr, size_t size);
int cudaFree(void* ptr);
std::uint64_t tagmem_fake_cudart_calls(void);
}

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

template <class F>
F shim(const char* name) {
  auto f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  EXPECT_NE(f, nullptr) << name << " is not exported by the shim";
  return f;
}

struct routing_api {
  decltype(&::tagmem_preload_set_thread_routing) set =
      shim<decltype(set)>("tagmem_preload_set_thread_routing");
  decltype(&::tagmem_preload_thread_routed) routed =
      shim<decltype(routed)>("tagmem_preload_thread_routed");
  decltype(&::tagmem_push_tag) push = shim<decltype(push)>("tagmem_push_tag");
  decltype(&::tagmem_pop_tag) pop = shim<decltype(pop)>("tagmem_pop_tag");
  decltype(&::tagmem_pointer_info) info = shim<decltype(info)>("tagmem_pointer_info");
  decltype(&::tagmem_offload) offload = shim<decltype(offload)>("tagmem_offload");
  decltype(&::tagmem_reload) reload = shim<decltype(reload)>("tagmem_reload");
};

const routing_api& api() {
  static routing_api a;
  return a;
}

// The tag owning `p`, "" for memory tagmem does not own.
std::string owner(void* p) {
  char name[TAGMEM_MAX_TAG_NAME + 1] = {};
  return api().info(p, name, sizeof name, nullptr, nullptr, nullptr) == TAGMEM_SUCCESS ? name : "";
}

buffer span(void* p, std::size_t size) {
  buffer b;
  b.va = reinterpret_cast<CUdeviceptr>(p);
  b.size = size;
  return b;
}

// Allocates `size` bytes with cudaMalloc, fills them with random bytes, offloads and reloads the
// owning tag with BACKUP, and checks every byte came back at the same address.
void expect_survives_offload(void* p, std::size_t size, const std::string& tag) {
  std::random_device seed;
  auto bytes = pattern(seed(), size);
  write_bytes(span(p, size), 0, bytes);
  const char* tags[] = {tag.c_str()};
  ASSERT_EQ(api().offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS);
  ASSERT_EQ(api().reload(tags, 1, 0), TAGMEM_SUCCESS);
  EXPECT_EQ(read_bytes(span(p, size), 0, size), bytes);
}

class ThreadRouting : public ::testing::Test {
 protected:
  void SetUp() override {
    use_device(0);
    ASSERT_EQ(std::getenv("TAGMEM_PRELOAD_TAG"), nullptr);
    ASSERT_EQ(std::getenv("TMS_INIT_ENABLE"), nullptr) << "run TmsInitEnable.* for that";
  }
  void TearDown() override { api().set(TAGMEM_PRELOAD_ROUTE_AUTO); }
};

TEST_F(ThreadRouting, OnSendsAllocationsOutsideAScopeToTheDefaultTag) {
  EXPECT_EQ(api().routed(), 0);
  EXPECT_EQ(api().set(TAGMEM_PRELOAD_ROUTE_ON), TAGMEM_PRELOAD_ROUTE_AUTO);
  EXPECT_EQ(api().routed(), 1);
  const std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 * MiB + 5), 0);
  EXPECT_EQ(owner(p), TAGMEM_DEFAULT_TAG);
  ASSERT_EQ(api().push("on-scoped"), TAGMEM_SUCCESS);
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&q, MiB), 0);
  ASSERT_EQ(api().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(owner(q), "on-scoped") << "ON routes into the current tag";
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls) << "the runtime saw none of these";
  expect_survives_offload(p, 3 * MiB + 5, TAGMEM_DEFAULT_TAG);
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(cudaFree(q), 0);
}

TEST_F(ThreadRouting, OffSendsAllocationsInsideAScopeToTheRuntime) {
  ASSERT_EQ(api().push("off-scoped"), TAGMEM_SUCCESS);
  EXPECT_EQ(api().routed(), 1);
  EXPECT_EQ(api().set(TAGMEM_PRELOAD_ROUTE_OFF), TAGMEM_PRELOAD_ROUTE_AUTO);
  EXPECT_EQ(api().routed(), 0);
  const std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, MiB), 0);
  EXPECT_EQ(owner(p), "");
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 1);
  EXPECT_EQ(api().set(TAGMEM_PRELOAD_ROUTE_AUTO), TAGMEM_PRELOAD_ROUTE_OFF);
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&q, MiB), 0);
  EXPECT_EQ(owner(q), "off-scoped") << "AUTO: the scope decides again";
  ASSERT_EQ(api().pop(), TAGMEM_SUCCESS);
  EXPECT_EQ(cudaFree(p), 0) << "a runtime pointer goes back to the runtime";
  EXPECT_EQ(cudaFree(q), 0);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls + 2);
}

TEST_F(ThreadRouting, UnknownModesChangeNothingAndModesArePerThread) {
  EXPECT_EQ(api().set(7), -2);
  EXPECT_EQ(api().set(-3), -2);
  EXPECT_EQ(api().set(TAGMEM_PRELOAD_ROUTE_ON), TAGMEM_PRELOAD_ROUTE_AUTO);
  int other_mode = -9, other_routed = -9;
  void* other_ptr = nullptr;
  std::thread t([&] {
    use_device(0);
    other_routed = api().routed();
    ASSERT_EQ(cudaMalloc(&other_ptr, MiB), 0);
    other_mode = api().set(TAGMEM_PRELOAD_ROUTE_AUTO);
  });
  t.join();
  EXPECT_EQ(other_mode, TAGMEM_PRELOAD_ROUTE_AUTO);
  EXPECT_EQ(other_routed, 0);
  EXPECT_EQ(owner(other_ptr), "");
  EXPECT_EQ(api().routed(), 1) << "the other thread did not change this one";
  EXPECT_EQ(cudaFree(other_ptr), 0);
}

TEST(TmsInitEnable, EveryAllocationIsInTheDefaultTagUnlessTheThreadSwitchesOff) {
  const char* v = std::getenv("TMS_INIT_ENABLE");
  ASSERT_TRUE(v && std::string(v) == "1") << "ctest runs this with TMS_INIT_ENABLE=1";
  use_device(0);
  EXPECT_EQ(api().routed(), 1);
  const std::uint64_t calls = tagmem_fake_cudart_calls();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 2 * MiB + 1), 0);
  EXPECT_EQ(owner(p), TAGMEM_DEFAULT_TAG);
  EXPECT_EQ(tagmem_fake_cudart_calls(), calls);
  const int before = api().set(TAGMEM_PRELOAD_ROUTE_OFF);
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&q, MiB), 0);
  EXPECT_EQ(owner(q), "") << "switched off: the runtime's memory";
  api().set(before);
  expect_survives_offload(p, 2 * MiB + 1, TAGMEM_DEFAULT_TAG);
  EXPECT_EQ(cudaFree(p), 0);
  EXPECT_EQ(cudaFree(q), 0);
}

}  // namespace
}  // namespace tagmem::preload_test
