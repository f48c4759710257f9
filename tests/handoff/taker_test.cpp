// taker_test.cpp — what the taker does with each handle it imports: the descriptor the handle came
// with is recorded before anything of the process can take the handle (inbox::put), so that
// memory taken the moment it arrives can be handed on, and its release closes the descriptor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "api/runtime.hpp"
#include "device/received_fds.hpp"
#include "handoff/inbox.hpp"
#include "harness.hpp"

namespace tagmem::handoff_test {
namespace {

// What the observer saw: for each handle, whether it could be handed on at once.
struct seen {
  handoff::inbox* held = nullptr;
  std::vector<bool> shareable;
  std::size_t released = 0;
};

// Plays a reload that takes a handle the moment it arrives, maps it, is done with it and gives it
// back to the driver: on the thread that put it there, so nothing can come in between.
void take_and_release(CUmemGenericAllocationHandle handle, void* arg) {
  auto& s = *static_cast<seen*>(arg);
  meta_vector<physical_part> parts;
  s.held->take_up_to(s.held->bytes(), parts);
  for (const physical_part& p : parts) {
    if (p.handle != handle) {  // only the one that arrived
      s.held->put_back(p);
      continue;
    }
    const int fd = received_fds::shareable_fd(p.handle);
    s.shareable.push_back(fd >= 0);
    if (fd >= 0) ::close(fd);
    if (received_fds::release_handle(p.handle) == CUDA_SUCCESS) s.released += p.size;
  }
}

class HandoffTaker : public shared_device_test {};

// The giver's two 30 MiB handles, each taken and released as it arrives. Both could be handed on
// (a descriptor was recorded), and no descriptor outlives its handle: shared_device_test's
// TearDown counts this process's descriptors of emulated device memory. Recorded after the put, as
// it once was, the descriptor found no record to close at the release and stayed open, holding
// the memory for the life of the process.
TEST_F(HandoffTaker, HandleTakenAsItArrivesIsHandedOnAndClosedWithItsRelease) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed_);
  tag_data kv = fill_tag("kv", 2, kPiece, rng);
  const char* kv_tag = "kv";
  ASSERT_EQ(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
  seen s;
  const handoff::inbox::arrival_observer observer{take_and_release, &s};
  {
    runtime::hold h;
    device& dev = h.dev(0);
    ASSERT_NE(dev.peers(), nullptr) << "handoff is off";
    s.held = &static_cast<handoff::inbox&>(dev.peers()->held());
    s.held->observe_arrivals(&observer);
  }
  discard_giver_hands_over(seed_ + 1);
  s.held->observe_arrivals(nullptr);
  EXPECT_EQ(s.shareable, std::vector<bool>({true, true}));
  EXPECT_EQ(s.released, 2 * kPiece);
  EXPECT_EQ(handoff_stats().held_bytes, 0u);
  ASSERT_EQ(tagmem_reload(&kv_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  refill(kv, rng());
  EXPECT_EQ(corrupted(kv), 0u);
  for (void* p : kv.ptrs) ASSERT_EQ(tagmem_free(p, nullptr), TAGMEM_SUCCESS);
}

}  // namespace
}  // namespace tagmem::handoff_test
