// copy_lanes_test.cpp — a reload's copy queue hands host-to-device pieces to whichever lane has
// room (copy_queue.hpp), and a copy engine's lane that stalls while the other copies on lets the
// copy kernel take pieces when the caller allows it (Note [a stalled stream]). On the emulated
// driver, which can hold one stream's copy (tagmem_emu_hold_next_h2d_copy) and slow every copy.
#include <chrono>
#include <cstring>
#include <thread>

#include "api/runtime.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "test_support.hpp"
#include "transfer/copy_queue.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kPieces = 48;

class EmulatorCopyLanes : public tagmem_test, public ::testing::WithParamInterface<bool> {
 protected:
  void TearDown() override {
    emulator().release_held_copy();
    emulator().set_copy_bytes_per_second(0);
    tagmem_test::TearDown();
  }
};

// 48 pieces of 1 MiB at 100 MiB/s; the first one's stream is held. The other stream finishes a
// piece every 10 ms, so the held one counts as stalled after a few; then the kernel takes
// pieces, if allowed. The held copy is let go once the kernel has run, or after 600 ms when it
// may not (10 s, a bound for a slow machine, when it may).
TEST_P(EmulatorCopyLanes, AStalledStreamGivesPiecesToTheKernelOnlyWhenAllowed) {
  const bool allowed = GetParam();
  restart_with_env("TAGMEM_COPY_KERNEL", "after_release");  // loaded; no release makes it wanted
  auto rng = rng_for_test();
  const std::vector<unsigned char> bytes = random_bytes(rng, kPieces * MiB);
  void* dst = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&dst, kPieces * MiB, "lanes", 0, nullptr));
  runtime::hold h;
  device& dev = h.dev(0);
  context_guard guard(dev.context());
  const auto& api = driver::api();
  void* host = nullptr;
  ASSERT_EQ(api.cuMemHostAlloc(&host, kPieces * MiB, 0), CUDA_SUCCESS);
  std::memcpy(host, bytes.data(), bytes.size());
  const std::uint64_t before = emulator().call_count("cuLaunchKernel");
  emulator().set_copy_bytes_per_second(100 * MiB);
  emulator().hold_next_h2d_copy();
  std::thread let_go([&] {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(allowed ? 10000 : 600);
    while (emulator().call_count("cuLaunchKernel") == before &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    emulator().release_held_copy();
  });
  {
    copy_queue q(dev, h2d_lanes::by_room);
    q.kernel_on_stall(allowed);
    const auto base = reinterpret_cast<CUdeviceptr>(dst);
    for (std::size_t i = 0; i < kPieces; ++i) {
      q.to_device({base + i * MiB, static_cast<char*>(host) + i * MiB, MiB}, "lanes");
    }
    q.finish();
  }
  let_go.join();
  emulator().set_copy_bytes_per_second(0);
  const std::uint64_t kernel_pieces = emulator().call_count("cuLaunchKernel") - before;
  if (allowed) {
    EXPECT_GT(kernel_pieces, 0u) << "the kernel took no piece while a stream was stalled";
  } else {
    EXPECT_EQ(kernel_pieces, 0u) << "the kernel took pieces without being allowed";
  }
  EXPECT_EQ(read_device(dst, bytes.size()), bytes);
  ASSERT_EQ(api.cuMemFreeHost(host), CUDA_SUCCESS);
  TAGMEM_OK(tagmem_free(dst, nullptr));
}

INSTANTIATE_TEST_SUITE_P(EmulatorStall, EmulatorCopyLanes, ::testing::Bool(), [](const auto& info) {
  return info.param ? std::string("allowed") : std::string("not_allowed");
});

}  // namespace
}  // namespace tagmem::test
