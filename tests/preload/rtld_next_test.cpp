// rtld_next_test.cpp — dlsym(RTLD_NEXT) of a driver symbol from a library in front of the
// driver (gpa_forwarder.c) finds the driver's definition, as it does without the shim, and a
// call through it completes (Note [RTLD_NEXT is the linker's] in dl_route.cpp).
//
// It runs in a process of its own (ctest preload_rtld_next_emu): loading the forwarder
// RTLD_GLOBAL puts the emulated driver in the global scope, which the other tests must not see.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "nccl_way.hpp"

extern "C" {
void* tagmem_unlisted_get_proc_address(void);
void* tagmem_unlisted_lookup(const char* name);
}

namespace tagmem::preload_test {
namespace {

template <class F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

const void* object_of(const void* address) {
  Dl_info info{};
  return dladdr(address, &info) ? info.dli_fbase : nullptr;
}

TEST(DlsymNext, ForwardingCuGetProcAddressFindsTheDriverNotItself) {
  // The emulated driver is loaded first, so the forwarder's dependency is this same instance.
  use_device(0);
  void* lib = dlopen("libtagmem_gpa_forwarder.so", RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto next = symbol<void* (*)()>(lib, "tagmem_forwarder_next");
  auto lookup = symbol<void* (*)(const char*)>(lib, "tagmem_forwarder_lookup");
  auto forwarded = symbol<std::uint64_t (*)()>(lib, "tagmem_forwarder_forwarded");
  auto recursions = symbol<std::uint64_t (*)()>(lib, "tagmem_forwarder_recursions");
  ASSERT_TRUE(next && lookup && forwarded && recursions);

  void* found = next();
  ASSERT_NE(found, nullptr) << "dlsym(RTLD_NEXT, \"cuGetProcAddress_v2\") found nothing";
  EXPECT_NE(object_of(found), object_of(reinterpret_cast<void*>(next)))
      << "the forwarder got its own cuGetProcAddress_v2 back";
  EXPECT_EQ(found, tagmem_unlisted_get_proc_address()) << "the next one is the driver's own";

  std::uint64_t before = forwarded();
  void* create = lookup("cuMemCreate");
  EXPECT_EQ(recursions(), 0u) << "the forwarder called itself";
  EXPECT_EQ(forwarded(), before + 1);
  ASSERT_NE(create, nullptr) << "the call through the forwarder did not complete";
  EXPECT_EQ(create, tagmem_unlisted_lookup("cuMemCreate"))
      << "the driver's own answer, unwrapped: the forwarder is not a recorded caller";
}

}  // namespace
}  // namespace tagmem::preload_test
