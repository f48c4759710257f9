// release_gate_test.cpp — the release thread asks its gate before each few handles and waits while
// the gate says copies are running, at most the gate's bound; tagmem_wait_released waits alike
// before it releases, a drain on running out of memory does not (Note [releases wait for copies] in
// device/release_queue.hpp). Runs on both drivers:
// a real handle goes through the device's own queue.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "api/runtime.hpp"
#include "device/release_queue.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "eventually.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

class ReleaseGate : public tagmem_test {};

class switch_gate final : public release_gate {
 public:
  std::atomic<bool> running{true};
  std::atomic<int> asked{0};
  // From the ask after this many on (0: never), copies run whatever `running` says, until it is
  // raised again.
  std::atomic<int> start_after{0};

 private:
  bool do_copies_running() noexcept override {
    const int n = ++asked;
    const int start = start_after.load();
    return running.load() || (start != 0 && n > start);
  }
};

// Device 0 with `gate` set on its release queue for one test, taken away at the end whatever
// happens.
struct gated {
  runtime::hold h;
  device& dev;
  switch_gate gate;
  explicit gated(std::chrono::milliseconds bound) : dev(h.dev(0)) {
    dev.releases().set_gate(&gate, bound);
  }
  ~gated() { dev.releases().set_gate(nullptr, std::chrono::milliseconds(0)); }
};

// One handle of `granules` times the device's granularity, created and pushed to its release
// queue; returns its bytes.
std::size_t push_one(device& dev, std::size_t granules = 1) {
  context_guard guard(dev.context());
  const std::size_t bytes = granules * dev.granularity();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(driver::api().cuMemCreate(&h, bytes, &dev.allocation_prop(), 0), CUDA_SUCCESS);
  dev.releases().push(h, bytes);
  return bytes;
}

// Granules in a handle of the bytes released after one ask.
std::size_t granules_per_ask(const device& dev) {
  return (release_queue::bytes_per_ask + dev.granularity() - 1) / dev.granularity();
}

TEST_F(ReleaseGate, QueuedMemoryWaitsWhileCopiesRunAndGoesWhenTheyEnd) {
  gated g(std::chrono::seconds(60));
  device& dev = g.dev;
  switch_gate& gate = g.gate;
  const std::size_t bytes = push_one(dev);
  // Asked at least twice: it polls, and it has not released in between.
  EXPECT_TRUE(eventually([&] { return gate.asked.load() >= 2; }));
  EXPECT_EQ(dev.releases().pending_bytes(), bytes) << "released while copies ran";
  gate.running = false;
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }))
      << "not released once the copies ended";
}

TEST_F(ReleaseGate, WaitEndsAtTheBound) {
  gated g(std::chrono::milliseconds(300));  // copies never end
  device& dev = g.dev;
  const auto start = std::chrono::steady_clock::now();
  push_one(dev);
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }))
      << "the bound did not end the wait";
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300))
      << "released before the bound while copies ran";
}

// Copies start after the thread's first ask, while four handles of an ask's bytes wait: the handle
// in hand goes, the other three wait for the copies' end, as the leftovers of a giver wait for a
// reload that takes its mark again while they go back.
TEST_F(ReleaseGate, CopiesThatStartWhileHandlesGoHoldBackTheRest) {
  gated g(std::chrono::seconds(60));
  device& dev = g.dev;
  switch_gate& gate = g.gate;
  gate.running = false;
  gate.start_after = 1;
  dev.releases().hold();  // all four queued before the thread looks
  std::size_t bytes = 0;
  for (int i = 0; i < 4; ++i) bytes = push_one(dev, granules_per_ask(dev));
  dev.releases().unhold();
  EXPECT_TRUE(eventually([&] { return gate.asked.load() >= 4; }));
  EXPECT_EQ(dev.releases().pending_bytes(), 3 * bytes)
      << "released other than the one handle in hand once copies started";
  gate.start_after = 1 << 30;
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }))
      << "not released once the copies ended";
}

// Small handles go an ask's bytes at a time, not an ask each: 40 of the smallest size take two
// asks (32 at most per ask).
TEST_F(ReleaseGate, SmallHandlesGoSeveralToAnAsk) {
  gated g(std::chrono::seconds(60));
  device& dev = g.dev;
  switch_gate& gate = g.gate;
  gate.running = false;
  constexpr int count = 40;
  dev.releases().hold();
  for (int i = 0; i < count; ++i) push_one(dev);
  dev.releases().unhold();
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }));
  const std::size_t per_ask = std::min(release_queue::handles_per_ask, granules_per_ask(dev));
  EXPECT_EQ(gate.asked.load(), static_cast<int>((count + per_ask - 1) / per_ask))
      << "asked other than once for each ask's bytes of small handles";
}

// A handle queued after a hold, while the queue is held, waits for the hold's end.
void expect_next_handle_waits_for_unhold(device& dev, const char* what) {
  const std::size_t bytes = push_one(dev);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dev.releases().pending_bytes(), bytes) << what;
  dev.releases().unhold();
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }));
}

// A hold holds back only what is queued after it (Note [background release]): a pause's leftovers,
// queued by one offload, go while its next offload, holding the queue, unmaps. Here the next hold
// comes before the thread can have taken any of them.
TEST_F(ReleaseGate, AHoldHoldsBackOnlyWhatIsQueuedAfterIt) {
  gated g(std::chrono::seconds(60));
  device& dev = g.dev;
  g.gate.running = false;
  dev.releases().hold();
  for (int i = 0; i < 3 * static_cast<int>(release_queue::handles_per_ask); ++i) push_one(dev);
  dev.releases().unhold();
  dev.releases().hold();
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }))
      << "a hold held back what was queued before it: " << dev.releases().pending_bytes()
      << " bytes left";
  expect_next_handle_waits_for_unhold(dev, "released while held");
}

// The same when the hold comes while the thread is releasing them, between two asks. On the
// emulator, whose held cuMemRelease puts the hold exactly there: the first slice's first release
// waits until the queue is held.
class EmulatorReleaseGate : public tagmem_test {};

// Queues three asks' worth of the smallest handles, lets the thread start on them with the first
// release of its first slice held in the emulator, and holds the queue meanwhile, as the next
// offload of a pause would. The caller lets the release go.
void hold_queue_mid_release(device& dev, switch_gate& gate) {
  gate.running = false;
  const int count = 3 * static_cast<int>(release_queue::handles_per_ask);
  dev.releases().hold();
  for (int i = 0; i < count; ++i) push_one(dev);
  emulator().hold_next_release();
  dev.releases().unhold();
  EXPECT_TRUE(eventually([&] { return gate.asked.load() >= 1; }));
  dev.releases().hold();
}

TEST_F(EmulatorReleaseGate, AHoldDoesNotStopReleasesUnderWay) {
  gated g(std::chrono::seconds(60));
  device& dev = g.dev;
  hold_queue_mid_release(dev, g.gate);
  emulator().release_held_release();
  EXPECT_TRUE(eventually([&] { return dev.releases().pending_bytes() == 0; }))
      << "a hold stopped releases under way: " << dev.releases().pending_bytes() << " bytes left";
  expect_next_handle_waits_for_unhold(dev, "released while held");
}

// A drain takes what the thread had left; what is queued after it, while held, still waits.
TEST_F(EmulatorReleaseGate, ADrainTakesTheRestMidRelease) {
  gated g(std::chrono::seconds(60));
  device& dev = g.dev;
  hold_queue_mid_release(dev, g.gate);
  // The drain takes the two slices left at once, then waits for the one in hand.
  std::thread drainer([&] { EXPECT_EQ(dev.releases().drain(), CUDA_SUCCESS); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  emulator().release_held_release();
  drainer.join();
  EXPECT_EQ(dev.releases().pending_bytes(), 0u);
  expect_next_handle_waits_for_unhold(dev, "released while held, after a drain");
}

// What a hold holds back, a drain still releases: an offload that runs out of device memory while
// its own pipeline holds the queue gets it.
TEST_F(ReleaseGate, ADrainTakesWhatAHoldHoldsBack) {
  runtime::hold h;
  device& dev = h.dev(0);
  dev.releases().hold();
  push_one(dev);
  push_one(dev);
  EXPECT_EQ(dev.releases().drain(), CUDA_SUCCESS);
  EXPECT_EQ(dev.releases().pending_bytes(), 0u) << "a drain left what the hold held back";
  dev.releases().unhold();
}

// tagmem_wait_released waits while copies run, then releases on the caller's thread.
TEST_F(ReleaseGate, WaitReleasedWaitsForRunningCopies) {
  gated g(std::chrono::hours(1));
  device& dev = g.dev;
  switch_gate& gate = g.gate;
  push_one(dev);
  std::atomic<bool> ended{false};
  std::thread copies([&] {  // the copies end once the caller has asked a few times
    while (gate.asked.load() < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ended = true;
    gate.running = false;
  });
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_TRUE(ended.load()) << "tagmem_wait_released returned while copies ran";
  EXPECT_EQ(dev.releases().pending_bytes(), 0u);
  copies.join();
}

// ... at most the gate's bound, as the thread.
TEST_F(ReleaseGate, WaitReleasedWaitsAtMostTheBound) {
  gated g(std::chrono::milliseconds(300));  // copies never end
  device& dev = g.dev;
  push_one(dev);
  const auto start = std::chrono::steady_clock::now();
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300))
      << "returned before the bound while copies ran";
  EXPECT_EQ(dev.releases().pending_bytes(), 0u);
}

// drain() (what tagmem does on running out of memory) does not wait for them.
TEST_F(ReleaseGate, DrainDoesNotWaitForRunningCopies) {
  gated g(std::chrono::hours(1));  // copies never end
  device& dev = g.dev;
  push_one(dev);
  EXPECT_EQ(dev.releases().drain(), CUDA_SUCCESS);
  EXPECT_EQ(dev.releases().pending_bytes(), 0u);
}

}  // namespace
}  // namespace tagmem::test
