// copy_lanes_test.cpp — a reload's copy queue hands host-to-device pieces to whichever lane has
// room (copy_queue.hpp): a copy stream that stalls holds at most its lane's depth while the other
// stream takes every other piece, and the copy kernel takes none (Note [a stalled stream]). On the
// emulated driver, which can hold one stream's copy (tagmem_emu_hold_next_h2d_copy) and slow
// every copy.
#include <algorithm>
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
constexpr std::size_t kDepth = copy_queue::engine_lane_depth;  // the held lane's pieces

class EmulatorCopyLanes : public tagmem_test {
 protected:
  void TearDown() override {
    if (emulator().available) {  // else tagmem_test::SetUp failed the test
      emulator().release_held_copy();
      emulator().set_copy_bytes_per_second(0);
    }
    tagmem_test::TearDown();
  }
};

// 48 pieces of 1 MiB at 100 MiB/s with the copy kernel loaded; the first piece's stream is held.
// The first lane takes pieces 0..15 and stalls on the first; the second takes the other 32 as it
// has room. While the hold lasts, those 32 arrive and 1..15 do not; once it is let go (when the
// 32 are there, or after 10 s, a bound for a slow machine), all 48. Round-robin dealing would
// have left every other piece behind the held one.
TEST_F(EmulatorCopyLanes, AStalledStreamHoldsItsDepthAndTheOtherStreamCopiesTheRest) {
  restart_with_env("TAGMEM_COPY_KERNEL", "after_release");  // loaded; no release makes it wanted
  auto rng = rng_for_test();
  const std::vector<unsigned char> bytes = random_bytes(rng, kPieces * MiB);
  const std::vector<unsigned char> zeros(kPieces * MiB, 0);
  void* dst = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&dst, kPieces * MiB, "lanes", 0, nullptr));
  write_device(dst, zeros.data(), zeros.size());
  runtime::hold h;
  device& dev = h.dev(0);
  context_guard guard(dev.context());
  const auto& api = driver::api();
  void* host = nullptr;
  ASSERT_EQ(api.cuMemHostAlloc(&host, kPieces * MiB, 0), CUDA_SUCCESS);
  std::memcpy(host, bytes.data(), bytes.size());
  const std::uint64_t kernels_before = emulator().call_count("cuLaunchKernel");
  emulator().set_copy_bytes_per_second(100 * MiB);
  emulator().hold_next_h2d_copy();
  // Whether piece i of what the device holds now matches piece i of `want`.
  std::vector<unsigned char> seen(kPieces * MiB);
  const auto same = [&](std::size_t i, const std::vector<unsigned char>& want) {
    return std::equal(seen.begin() + i * MiB, seen.begin() + (i + 1) * MiB, want.begin() + i * MiB);
  };
  bool rest_arrived = false;
  std::size_t held_back = 0;  // of pieces 1..kDepth-1, those still zero while the hold lasts
  std::thread let_go([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!rest_arrived && std::chrono::steady_clock::now() < until) {
      read_device(seen.data(), dst, seen.size());
      rest_arrived = true;
      for (std::size_t i = kDepth; i < kPieces; ++i) rest_arrived = rest_arrived && same(i, bytes);
      if (!rest_arrived) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (std::size_t i = 1; i < kDepth; ++i) held_back += same(i, zeros) ? 1 : 0;
    emulator().release_held_copy();
  });
  {
    copy_queue q(dev, h2d_lanes::by_room);
    const auto base = reinterpret_cast<CUdeviceptr>(dst);
    for (std::size_t i = 0; i < kPieces; ++i) {
      q.to_device({base + i * MiB, static_cast<char*>(host) + i * MiB, MiB}, "lanes");
    }
    q.finish();
  }
  let_go.join();
  emulator().set_copy_bytes_per_second(0);
  EXPECT_TRUE(rest_arrived) << "the pieces after the held lane's did not arrive while it stalled";
  EXPECT_EQ(held_back, kDepth - 1) << "the held lane did not hold exactly its depth";
  EXPECT_EQ(emulator().call_count("cuLaunchKernel"), kernels_before)
      << "the kernel took pieces from a stalled stream";
  EXPECT_EQ(read_device(dst, bytes.size()), bytes);
  ASSERT_EQ(api.cuMemFreeHost(host), CUDA_SUCCESS);
  TAGMEM_OK(tagmem_free(dst, nullptr));
}

}  // namespace
}  // namespace tagmem::test
