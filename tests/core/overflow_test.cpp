// overflow_test.cpp — sizes near SIZE_MAX fail with a status and a message instead of wrapping to
// a small size: host reserves (waiting and in the background), the host store's own growth, the
// pinning helper and the block pool. A wrapped size would "succeed" pinning nothing, or leave
// threads waiting forever for pinning that never progressed; the calls that could hang run under
// a watchdog so that a regression fails the suite instead of stalling it.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "device/block_pool.hpp"
#include "device/device.hpp"
#include "device/vm_arena.hpp"
#include "host/host_pinning.hpp"
#include "host/host_store.hpp"
#include "options/config.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t kSlab = 2u << 20;

// Sizes whose rounding up to 2 MiB (or to 256 bytes) passes SIZE_MAX.
const std::size_t kWrapping[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - kSlab + 2, SIZE_MAX - 200};

// Runs `body` on another thread and ends the process with a failure if it has not returned in
// `limit`: a hung call can be neither joined nor cancelled, and a suite that hangs reports nothing.
void within(std::chrono::seconds limit, const char* what, std::function<void()> body) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([body = std::move(body), done] {
    body();
    done->set_value();
  }).detach();
  if (finished.wait_for(limit) == std::future_status::ready) return;
  std::fprintf(stderr, "FAILED: %s did not return within %lld s (hung)\n", what,
               static_cast<long long>(limit.count()));
  std::fflush(nullptr);
  std::_Exit(1);
}

CUcontext retained_primary_context() {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  EXPECT_EQ(driver_api_for_tests().cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(driver_api_for_tests().cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  return ctx;
}

void release_primary_context() {
  CUdevice dev = 0;
  EXPECT_EQ(driver_api_for_tests().cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(driver_api_for_tests().cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
}

std::size_t pinned_bytes() {
  tagmem_device_stats s{};
  EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.host_pinned_bytes;
}

class Overflow : public tagmem_test {};

TEST_F(Overflow, WaitingHostReserveOfAWrappingSizeIsRefused) {
  for (std::size_t bytes : kWrapping) {
    tagmem_status s = tagmem_host_reserve(bytes, 1);
    ASSERT_EQ(s, TAGMEM_ERROR_INVALID_ARGUMENT)
        << "tagmem_host_reserve(" << bytes << ", 1) returned " << tagmem_status_string(s);
    EXPECT_NE(std::strstr(tagmem_last_error(), std::to_string(bytes).c_str()), nullptr)
        << tagmem_last_error();
    EXPECT_EQ(pinned_bytes(), 0u);
  }
  // Beyond any address space but not wrapping: refused before anything is mapped.
  TAGMEM_FAILS_WITH(tagmem_host_reserve((std::size_t{1} << 48) + 1, 1),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  // A sane reserve still works afterwards.
  TAGMEM_OK(tagmem_host_reserve(kSlab, 1));
  EXPECT_GE(pinned_bytes(), kSlab);
}

TEST_F(Overflow, BackgroundHostReserveOfAWrappingSizeLeavesOffloadsWorking) {
  auto rng = rng_for_test();
  auto spill = fill(rng, "spill", 1, 3u << 20);
  ASSERT_EQ(spill.size(), 1u);
  within(std::chrono::seconds(120), "reserve(SIZE_MAX, 0) then a BACKUP offload", [&] {
    for (std::size_t huge : kWrapping) {
      tagmem_status s = tagmem_host_reserve(huge, 0);
      EXPECT_EQ(s, TAGMEM_ERROR_INVALID_ARGUMENT)
          << "tagmem_host_reserve(" << huge << ", 0) returned " << tagmem_status_string(s);
    }
    const char* tags[] = {"spill"};
    EXPECT_EQ(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(tagmem_reload(tags, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(tagmem_host_trim(0), TAGMEM_SUCCESS) << tagmem_last_error();
  });
  EXPECT_EQ(corrupted(spill), 0u);
  TAGMEM_OK(tagmem_free(spill[0].ptr, nullptr));
}

TEST_F(Overflow, HostStoreAcquireOfAWrappingSizeThrowsWithNothingTaken) {
  CUcontext ctx = retained_primary_context();
  {
    host_store store(kSlab, ctx);  // empty: the whole request is to be pinned
    within(std::chrono::seconds(120), "host_store::acquire(SIZE_MAX)", [&] {
      for (std::size_t bytes : kWrapping) {
        try {
          store.acquire(bytes);
          ADD_FAILURE() << "acquire(" << bytes << ") succeeded";
        } catch (const error& e) {
          EXPECT_EQ(e.code(), TAGMEM_ERROR_HOST_OUT_OF_MEMORY) << e.what();
        }
      }
    });
    host_store_stats s = store.stats();
    EXPECT_EQ(s.pinned_bytes, 0u);
    EXPECT_EQ(s.used_bytes, 0u);
    auto extents = store.acquire(kSlab);  // a sane request still pins and hands out its bytes
    ASSERT_EQ(extents.size(), 1u);
    EXPECT_EQ(extents[0].size, kSlab);
    store.release(extents);
  }
  release_primary_context();
}

TEST_F(Overflow, PinningAWrappingSizeThrowsAndPinsNothing) {
  CUcontext ctx = retained_primary_context();
  for (std::size_t bytes : kWrapping) {
    std::size_t handed_out = 0;
    try {
      pin_parallel(bytes, kSlab, 2, pin_method::register_huge, ctx,
                   [&](pinned_slab r) { handed_out += r.size; });
      ADD_FAILURE() << "pin_parallel(" << bytes << ") returned";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), TAGMEM_ERROR_HOST_OUT_OF_MEMORY) << e.what();
    }
    EXPECT_EQ(handed_out, 0u);
  }
  release_primary_context();
}

TEST_F(Overflow, BlockPoolRefusesAWrappingSize) {
  const config cfg = make_config(nullptr);
  device dev(0, cfg);
  vm_arena arena(dev, cfg, nullptr);
  block_pool pool(arena, cfg);
  for (std::size_t bytes : kWrapping) {
    try {
      block* b = pool.allocate(bytes, nullptr);
      ADD_FAILURE() << "allocate(" << bytes << ") returned a block of " << b->size << " bytes";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), TAGMEM_ERROR_INVALID_ARGUMENT) << e.what();
    }
  }
  EXPECT_EQ(pool.totals().live_allocations, 0u);
  EXPECT_EQ(pool.totals().allocated_bytes, 0u);
}

TEST_F(Overflow, MallocOfAWrappingSizeIsRefused) {
  for (std::size_t bytes : kWrapping) {
    void* p = reinterpret_cast<void*>(0x1);
    TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, bytes, "huge", 0, nullptr),
                      TAGMEM_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(p, nullptr);
  }
}

}  // namespace
}  // namespace tagmem::test
