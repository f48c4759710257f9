// trust_test.cpp — the one check every handoff and IPC peer passes (allocator/handoff/trust.hpp):
// a peer of another user is refused even when everything it claims matches, and so is one whose
// claim differs from what the kernel reports, or of another job, GPU or granularity. The
// protocol-level forgeries (a process lying on the wire) are in meet_test.cpp; another uid
// cannot be forged there without root, so it is checked on the function itself.
#include "handoff/trust.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace tagmem::handoff_test {
namespace {

struct HandoffTrust : ::testing::Test {
  handoff::local_view me;
  peers::peer_credentials cred;
  peers::process_identity live;
  handoff::claim claim;

  void SetUp() override {
    me.job = "job-a";
    me.uuid.fill(7);
    me.granularity = 2u << 20;
    me.uid = ::geteuid();
    live = {4242, 99};
    cred = {live.pid, me.uid};
    claim.job = me.job;
    claim.uuid = me.uuid;
    claim.granularity = me.granularity;
    claim.who = live;
  }
  // The reason of the refusal; fails the test if it lacks `words`.
  void expect_refused(const char* words) {
    const std::string why = handoff::mismatch(me, cred, live, claim);
    EXPECT_NE(why.find(words), std::string::npos) << "reason: '" << why << "'";
    EXPECT_NE(why.find("4242"), std::string::npos) << "the peer is not named: '" << why << "'";
  }
};

TEST_F(HandoffTrust, TheSameUserJobAndGpuIsTrusted) {
  EXPECT_EQ(handoff::mismatch(me, cred, live, claim), "");
}

TEST_F(HandoffTrust, AnotherUserIsRefusedWhateverItClaims) {
  cred.uid = me.uid + 1;
  expect_refused("runs as uid");
  cred.uid = me.uid == 0 ? 65534 : 0;  // root, or nobody when this is root
  expect_refused("runs as uid");
}

TEST_F(HandoffTrust, AClaimTheKernelDoesNotConfirmIsRefused) {
  claim.who.pid = live.pid + 1;  // says it is another process
  expect_refused("claims to be");
  claim.who = live;
  claim.who.start = live.start + 1;  // the pid reused by a process started later
  expect_refused("claims to be");
}

TEST_F(HandoffTrust, AnotherJobGpuOrGranularityIsRefused) {
  claim.job = "job-b";
  expect_refused("job 'job-b'");
  claim.job = me.job;
  claim.uuid[0] ^= 1;
  expect_refused("uses GPU");
  claim.uuid = me.uuid;
  claim.granularity = me.granularity * 2;
  expect_refused("maps in units of");
}

}  // namespace
}  // namespace tagmem::handoff_test
