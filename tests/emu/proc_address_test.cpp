// proc_address_test.cpp — the library loads the way tagmem's driver seam loads a driver
// (dlopen + cuGetProcAddress_v2) and answers every entry of entry_points.def with its own
// function of the right ABI; lookups answer like the real driver (measured, driver 580).
#include <dlfcn.h>

#include <cstring>

#include "support.hpp"

#undef cuGetProcAddress
extern "C" CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags);

namespace tagmem::emu::test {
namespace {

using get_proc_fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult*);

class proc_address : public ::testing::Test {
 protected:
  void SetUp() override {
    library_ = ::dlopen(TAGMEM_EMU_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << ::dlerror();
    get_proc_ = reinterpret_cast<get_proc_fn>(::dlsym(library_, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc_, nullptr);
  }
  void TearDown() override { ::dlclose(library_); }

  void* library_ = nullptr;
  get_proc_fn get_proc_ = nullptr;
};

TEST_F(proc_address, EveryEntryPointResolvesToItsCurrentAbi) {
  int entries = 0;
#define TAGMEM_DRIVER_ENTRY(name)                                                        \
  {                                                                                      \
    void* fn = nullptr;                                                                  \
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;        \
    EXPECT_EQ(get_proc_(#name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status), \
              CUDA_SUCCESS);                                                             \
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << #name;                             \
    EXPECT_EQ(fn, reinterpret_cast<void*>(&::name)) << #name;                            \
    ++entries;                                                                           \
  }
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
  EXPECT_GT(entries, 50);
}

TEST_F(proc_address, LookupsAnswerLikeTheDriver) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  // Unknown: success, a null function and the status say so (v2); NOT_FOUND (legacy).
  CU_EXPECT(get_proc_("cuNotAThing", &fn, CUDA_VERSION, 0, &status));
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(cuGetProcAddress("cuNotAThing", &fn, CUDA_VERSION, 0), CUDA_ERROR_NOT_FOUND);
  CU_EXPECT(cuGetProcAddress("cuMemMap", &fn, CUDA_VERSION, 0));
  EXPECT_EQ(fn, reinterpret_cast<void*>(&::cuMemMap));
  // The runtime looks cuGetProcAddress itself up and calls through the answer.
  CU_EXPECT(get_proc_("cuGetProcAddress", &fn, CUDA_VERSION, 0, &status));
  EXPECT_EQ(fn, reinterpret_cast<void*>(get_proc_));
  CU_EXPECT(get_proc_("cuInit", &fn, 0, 0, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(get_proc_("cuInit", &fn, CUDA_VERSION, 99, &status), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get_proc_(nullptr, &fn, CUDA_VERSION, 0, &status), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get_proc_("cuInit", nullptr, CUDA_VERSION, 0, &status), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(proc_address, OnlyDriverAndControlSymbolsAreExported) {
  EXPECT_NE(::dlsym(library_, "cuMemcpyHtoDAsync_v2"), nullptr);
  EXPECT_NE(::dlsym(library_, "cuCtxSynchronize"), nullptr);  // the unversioned ones too
  EXPECT_NE(::dlsym(library_, "tagmem_emu_fail_call"), nullptr);
  EXPECT_EQ(::dlsym(library_, "_ZN6tagmem3emu9take_lockEv"), nullptr);
}

}  // namespace
}  // namespace tagmem::emu::test
