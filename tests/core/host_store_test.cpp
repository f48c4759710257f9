// host_store_test.cpp — a pinned slab that cannot be unpinned is never lost or unmapped, by every
// pinning method (Note [unpin keeps what it cannot release] in host_pinning.hpp, Note [trim keeps
// what it cannot unpin] in host_store.cpp). Needs the emulator's fault injection, so the suites
// are named Emulator* and excluded from the GPU run.
#include "host/host_store.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "host/host_pinning.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t kSlab = 2u << 20;

// The driver call that gives a range of this method back.
const char* unpin_call(pin_method how) {
  return how == pin_method::host_alloc ? "cuMemFreeHost" : "cuMemHostUnregister";
}

// Whether every page of [p, p + n) is mapped in this process.
bool is_mapped(const void* p, std::size_t n) {
  std::vector<unsigned char> pages(n / static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  return mincore(const_cast<void*>(p), n, pages.data()) == 0;
}

// A fresh tagmem whose host store pins 2 MiB slabs by the method under test, four at a time.
class EmulatorHostStore : public tagmem_test, public ::testing::WithParamInterface<pin_method> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    ASSERT_TRUE(emulator().fail_call && emulator().clear_faults);
    ASSERT_EQ(emulator().pinned_host_bytes(), 0u)
        << "the emulator holds pinned memory before the test";
    tagmem_test::SetUp();
  }

  tagmem_device_stats device_stats() {
    tagmem_device_stats s{};
    EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
    return s;
  }

  const char* unpin() const { return unpin_call(GetParam()); }

  scoped_env method_{"TAGMEM_HOST_PIN", pin_method_name(GetParam())};
  scoped_env slab_{"TAGMEM_HOST_SLAB_BYTES", "2M"};
  scoped_env threads_{"TAGMEM_HOST_PIN_THREADS", "4"};
};

TEST_P(EmulatorHostStore, TrimKeepsSlabWhoseUnpinFailsAndReportsIt) {
  TAGMEM_OK(tagmem_host_reserve(4 * kSlab, 1));  // four slabs, pinned on four threads
  ASSERT_EQ(device_stats().host_pinned_bytes, 4 * kSlab);
  ASSERT_EQ(emulator().pinned_host_bytes(), 4 * kSlab);

  ASSERT_EQ(emulator().fail_call(unpin(), 2, CUDA_ERROR_UNKNOWN), 0);
  TAGMEM_FAILS_WITH(tagmem_host_trim(0), TAGMEM_ERROR_DRIVER);
  EXPECT_NE(std::strstr(tagmem_last_error(), unpin()), nullptr) << tagmem_last_error();
  emulator().clear_faults();
  // The three slabs unpinned fine are gone; the fourth is still pinned, and the store says so.
  tagmem_device_stats ds = device_stats();
  EXPECT_EQ(ds.host_pinned_bytes, kSlab);
  EXPECT_EQ(emulator().pinned_host_bytes(), kSlab);
  EXPECT_EQ(ds.host_pinned_high_water, 4 * kSlab);
  EXPECT_EQ(ds.host_used_bytes, 0u);

  // The kept slab holds a backup (a small request maps one 2 MiB chunk) without pinning more.
  auto rng = rng_for_test();
  const std::size_t n = 512u << 10;
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, n, "kept", 0, nullptr));
  auto bytes = random_bytes(rng, n);
  write_device(p, bytes.data(), n);
  const char* tags[] = {"kept"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  ds = device_stats();
  EXPECT_EQ(ds.host_pinned_bytes, kSlab) << "the offload pinned a new slab";
  EXPECT_GT(ds.host_used_bytes, 0u);
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(read_device(p, n), bytes);
  TAGMEM_OK(tagmem_free(p, nullptr));

  // Without the fault the same trim succeeds and gives everything back.
  TAGMEM_OK(tagmem_host_trim(0));
  EXPECT_EQ(device_stats().host_pinned_bytes, 0u);
  EXPECT_EQ(emulator().pinned_host_bytes(), 0u);
}

TEST_P(EmulatorHostStore, TrimWhoseEveryUnpinFailsKeepsEverySlab) {
  TAGMEM_OK(tagmem_host_reserve(2 * kSlab, 1));
  for (std::uint64_t nth : {1, 2}) {
    ASSERT_EQ(emulator().fail_call(unpin(), nth, CUDA_ERROR_INVALID_VALUE), 0);
  }
  TAGMEM_FAILS_WITH(tagmem_host_trim(0), TAGMEM_ERROR_DRIVER);
  emulator().clear_faults();
  EXPECT_EQ(device_stats().host_pinned_bytes, 2 * kSlab);
  EXPECT_EQ(emulator().pinned_host_bytes(), 2 * kSlab);
  TAGMEM_OK(tagmem_host_trim(0));
  EXPECT_EQ(device_stats().host_pinned_bytes, 0u);
  EXPECT_EQ(emulator().pinned_host_bytes(), 0u);
}

TEST_P(EmulatorHostStore, DestructorLeavesSlabItCannotUnpinMapped) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  ASSERT_EQ(driver_api_for_tests().cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(driver_api_for_tests().cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  char* kept = nullptr;
  {
    host_store store(kSlab, ctx);
    store.reserve(kSlab, host_store::growth::now);
    auto extents = store.acquire(kSlab);  // the one slab, whole
    ASSERT_EQ(extents.size(), 1u);
    kept = extents[0].ptr;
    std::memset(kept, 0x5a, kSlab);
    store.release(extents);
    ASSERT_EQ(emulator().fail_call(unpin(), 1, CUDA_ERROR_UNKNOWN), 0);
  }  // the destructor's unpin fails: it must neither throw nor unmap the slab
  emulator().clear_faults();
  EXPECT_EQ(emulator().pinned_host_bytes(), kSlab);
  ASSERT_TRUE(is_mapped(kept, kSlab)) << "a slab still registered with the driver was unmapped";
  EXPECT_EQ(kept[kSlab - 1], 0x5a);
  // Give it back by hand so that later tests start clean.
  pinned_slab r{kept, kSlab};
  EXPECT_TRUE(unpin_slab(r, GetParam(), ctx).ok());
  EXPECT_EQ(emulator().pinned_host_bytes(), 0u);
  driver_api_for_tests().cuDevicePrimaryCtxRelease(dev);
}

// Named Emulator* so that the GPU run (--gtest_filter=-Emulator*) leaves them out.
INSTANTIATE_TEST_SUITE_P(EmulatorPinMethods, EmulatorHostStore,
                         ::testing::Values(pin_method::register_huge, pin_method::register_small,
                                           pin_method::host_alloc),
                         [](const ::testing::TestParamInfo<pin_method>& info) {
                           return std::string(pin_method_name(info.param));
                         });

// Two growths at once (Note [host budget]): growth B reads the host's figures, growth A then
// reads, claims and pins all the room there is, and only then does B claim with what it read,
// which still counts A's slabs as available. B must not pin them a second time.
class EmulatorHostStoreBudget : public tagmem_test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(using_emulator()) << "Emulator* suites need TAGMEM_LIBCUDA=libtagmem_emu.so";
    ASSERT_EQ(emulator().pinned_host_bytes(), 0u);
    tagmem_test::SetUp();
  }
};

// The host as the kernel would report it: 1 GiB (a 64 MiB margin) of which 64 + 8 MiB are
// available, less what the emulated driver has pinned. The first reading (growth B's) waits,
// after reading, until growth A is done.
struct racing_host {
  std::mutex mutex;
  std::condition_variable changed;
  int readings = 0;
  bool a_done = false;

  static host_memory read(void* self) {
    auto& h = *static_cast<racing_host*>(self);
    host_memory m;
    m.total = std::size_t(1) << 30;
    m.available = (72u << 20) - std::min<std::size_t>(emulator().pinned_host_bytes(), 72u << 20);
    m.limited_by = "a test";
    std::unique_lock lock(h.mutex);
    if (++h.readings == 1) {
      h.changed.notify_all();
      h.changed.wait(lock, [&] { return h.a_done; });
    }
    return m;
  }
};

TEST_F(EmulatorHostStoreBudget, TwoGrowthsAtOnceDoNotBothPassTheBudget) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  ASSERT_EQ(driver_api_for_tests().cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(driver_api_for_tests().cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  {
    host_store store(kSlab, ctx);
    racing_host host;
    store.set_memory_source(&racing_host::read, &host);
    tagmem_status b_status = TAGMEM_SUCCESS;
    std::thread b([&] {
      try {
        store.release(store.acquire(8u << 20));
      } catch (const error& e) {
        b_status = e.code();
      }
    });
    {
      std::unique_lock lock(host.mutex);
      host.changed.wait(lock, [&] { return host.readings == 1; });
    }
    auto a = store.acquire(8u << 20);  // the 8 MiB of headroom there are
    {
      std::lock_guard lock(host.mutex);
      host.a_done = true;
      host.changed.notify_all();
    }
    b.join();
    EXPECT_EQ(b_status, TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
    EXPECT_EQ(emulator().pinned_host_bytes(), 8u << 20) << "the two growths pinned more than the "
                                                           "8 MiB available";
    store.release(a);
  }
  EXPECT_EQ(emulator().pinned_host_bytes(), 0u);
  driver_api_for_tests().cuDevicePrimaryCtxRelease(dev);
}

}  // namespace
}  // namespace tagmem::test
