// meet_test.cpp — processes of one job meeting through the job's directory, and the checks that
// keep memory within the job: a taker greets only givers of its user, job and GPU that are who
// they claim; a giver hands nothing to a socket served by a process other than the one named.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "api/runtime.hpp"
#include "emu_controls.hpp"
#include "handoff/handoff_messages.hpp"
#include "handoff/handoff_point.hpp"
#include "harness.hpp"
#include "peer.hpp"
#include "peers/job_identity.hpp"
#include "peers/unix_channel.hpp"
#include "registry/registry.hpp"

namespace tagmem::handoff_test {
namespace {

std::string report_line(const tagmem_handoff_stats& s, const fd_census& before,
                        const fd_census& after, const std::string& leaks) {
  return "given " + std::to_string(s.given_bytes) + " refused " + std::to_string(s.refused_peers) +
         " leaks '" + leaks + "' fds " + (after == before ? "same" : describe(after));
}

// A giver: offloads a DISCARD tag of two mappings once told to, reports and leaves nothing.
TAGMEM_PEER_SCENARIO(discard_giver) {
  const fd_census before = take_fd_census();
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data kv = fill_tag("kv", 2, kPiece, rng);
  args.channel.expect("offload");
  const char* kv_tag = "kv";
  check(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), "offload kv");
  const tagmem_handoff_stats s = handoff_stats();
  check(tagmem_shutdown(), "tagmem_shutdown");
  args.channel.send(report_line(s, before, take_fd_census(), emu_leaks()));
  return 0;
}

// A taker: offloads a BACKUP tag (so it listens), counts what it refused, reloads and checks.
TAGMEM_PEER_SCENARIO(backup_taker) {
  const fd_census before = take_fd_census();
  check(tagmem_init(nullptr), "tagmem_init");
  std::mt19937_64 rng(std::stoull(args.channel.receive()));
  tag_data w = fill_tag("w", 2, kPiece, rng);
  const char* w_tag = "w";
  check(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), "offload w");
  args.channel.send("listening");
  args.channel.expect("reload");
  const tagmem_handoff_stats s = handoff_stats();
  check(tagmem_reload(&w_tag, 1, 0), "reload w");
  const std::size_t bad = corrupted(w);
  check(tagmem_shutdown(), "tagmem_shutdown");
  args.channel.send(report_line(s, before, take_fd_census(), emu_leaks()) + " corrupted " +
                    std::to_string(bad));
  return 0;
}

class HandoffMeet : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    before_ = take_fd_census();
  }
  void TearDown() override {
    tagmem_shutdown();
    EXPECT_EQ(emu_leaks(), "");
    EXPECT_EQ(take_fd_census(), before_)
        << describe(take_fd_census()) << " / " << describe(before_);
  }
  std::uint64_t seed_ = 0;
  fd_census before_;
};

TEST_F(HandoffMeet, DiscardOffloadGoesToListeningPeer) {
  std::mt19937_64 rng(seed_);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  tag_data w = fill_tag("w", 2, kPiece, rng);
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  {
    peer_process giver("discard_giver", "g");
    giver.channel().send(std::to_string(seed_));
    giver.channel().send("offload");
    EXPECT_EQ(giver.channel().receive(),
              "given " + std::to_string(2 * kPiece) + " refused 0 leaks '' fds same");
    EXPECT_EQ(giver.wait(), 0);
  }
  EXPECT_EQ(handoff_stats().held_bytes, 2 * kPiece);
  const std::uint64_t creates = emu_calls("cuMemCreate");
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(emu_calls("cuMemCreate"), creates);
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 2 * kPiece);
}

// Memory goes back to the process that created it: this process's DISCARD tag goes to a peer
// (overlap_test.cpp's trainer), which maps it as its own; when the peer offloads, the memory comes
// back, sent as the descriptor it arrived with (the driver does not export an imported handle,
// Note [one hop]), and this process's reload maps its two handles whole, without a create. With
// `small_runs` the trainer's mapping limits (8 MiB) are below the handles' size (12 MiB), as an
// engine's 1,920 MiB kv mappings are below the default 1 GiB: the paused trainer must still take
// them at this process's pause, or they go to the driver.
void kv_round_trip(std::uint64_t seed, bool small_runs) {
  if (small_runs) {
    setenv("TAGMEM_MAX_MAPPING_BYTES", "8MiB", 1);
    setenv("TAGMEM_DISCARD_MAPPING_BYTES", "8MiB", 1);
  }
  peer_process trainer("overlap_trainer", "t");  // reads the limits at its tagmem_init
  trainer.channel().send(std::to_string(seed + 1) + " 2 12 1");  // two 12 MiB mappings, paused
  const std::string ready = trainer.channel().receive();
  if (small_runs) {
    unsetenv("TAGMEM_MAX_MAPPING_BYTES");
    unsetenv("TAGMEM_DISCARD_MAPPING_BYTES");
  }
  ASSERT_EQ(ready, "ready");
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mt19937_64 rng(seed);
  tag_data kv = fill_tag("kv", 2, 12 * MiB, rng);
  const char* kv_tag = "kv";
  ASSERT_EQ(tagmem_offload(&kv_tag, 1, 0, TAGMEM_DISCARD), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(handoff_stats().given_bytes, 24 * MiB);  // none to the driver
  trainer.channel().send("resume");
  ASSERT_EQ(trainer.channel().receive(), "intact");
  trainer.channel().send("pause");
  EXPECT_EQ(trainer.channel().receive(), "paused given " + std::to_string(24 * MiB));
  EXPECT_EQ(handoff_stats().held_bytes, 24 * MiB);
  const std::uint64_t creates = emu_calls("cuMemCreate");
  const std::uint64_t maps = emu_calls("cuMemMap");
  ASSERT_EQ(tagmem_reload(&kv_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(emu_calls("cuMemCreate"), creates);
  if (reliability::emu().available) {             // the real driver's calls are not counted
    EXPECT_EQ(emu_calls("cuMemMap") - maps, 2u);  // its two handles, whole
  }
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 24 * MiB);
  trainer.channel().send("exit");
  EXPECT_EQ(trainer.wait(), 0);
}

TEST_F(HandoffMeet, ReceivedMemoryGoesBackToItsCreator) { kv_round_trip(seed_, false); }

TEST_F(HandoffMeet, LargeKvHandlesComeBackWholeThroughATrainerWithSmallerRuns) {
  kv_round_trip(seed_, true);
}

// A process that has offloaded and not yet begun its reload (a trainer paused while the engine
// pauses its kv cache first) takes handles larger than its mapping limit when its offloaded tag
// lies side by side over them: its reload will grow a run to map each. Here both mapping limits
// are 16 MiB and the giver's handles are 30 MiB; were they refused, they would go to the driver
// and the reload would create its memory anew.
TEST_F(HandoffMeet, OffloadedPeerTakesHandlesItsSpanCanMapBeforeItReloads) {
  std::mt19937_64 rng(seed_);
  setenv("TAGMEM_DISCARD_MAPPING_BYTES", "16MiB", 1);
  const tagmem_status init = init_with("TAGMEM_MAX_MAPPING_BYTES", "16MiB");
  unsetenv("TAGMEM_DISCARD_MAPPING_BYTES");
  ASSERT_EQ(init, TAGMEM_SUCCESS) << tagmem_last_error();
  tag_data w = fill_tag("w", 4, 16 * MiB, rng);
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  discard_giver_hands_over(seed_ + 1);
  EXPECT_EQ(handoff_stats().held_bytes, 2 * kPiece);
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
  EXPECT_EQ(handoff_stats().mapped_received_bytes, 2 * kPiece);
}

// A giver of another job lists other files: it finds no taker and its memory goes to the driver.
TEST_F(HandoffMeet, GiverOfAnotherJobFindsNoTaker) {
  std::mt19937_64 rng(seed_);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  tag_data w = fill_tag("w", 2, kPiece, rng);
  const char* w_tag = "w";
  ASSERT_EQ(tagmem_offload(&w_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  const std::string job = std::getenv("TAGMEM_JOB");
  setenv("TAGMEM_JOB", (job + "-other").c_str(), 1);
  auto giver = std::make_unique<peer_process>("discard_giver", "g");
  setenv("TAGMEM_JOB", job.c_str(), 1);
  giver->channel().send(std::to_string(seed_));
  giver->channel().send("offload");
  EXPECT_EQ(giver->channel().receive(), "given 0 refused 0 leaks '' fds same");
  EXPECT_EQ(giver->wait(), 0);
  giver.reset();
  EXPECT_EQ(handoff_stats().received_bytes, 0u);
  ASSERT_EQ(tagmem_reload(&w_tag, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(corrupted(w), 0u);
}

// The test process as a forged giver: it greets a real taker with claims that are not its own.
struct forged_hello {
  const char* what;
  void (*forge)(handoff::claim& c);
};

class HandoffForgedGiver : public HandoffMeet,
                           public ::testing::WithParamInterface<forged_hello> {};

TEST_P(HandoffForgedGiver, IsRefusedAndGivesNothing) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  handoff::claim mine;
  {
    runtime::hold h;
    device& d = h.core().dev(0);
    mine.job = std::getenv("TAGMEM_JOB");
    std::memcpy(mine.uuid.data(), d.uuid().bytes, 16);
    mine.granularity = d.granularity();
    mine.who = peers::identity_of(::getpid());
  }
  auto taker = std::make_unique<peer_process>("backup_taker", "t");
  taker->channel().send(std::to_string(seed_));
  ASSERT_EQ(taker->channel().receive(), "listening");
  const auto found = handoff::list_receivers(std::getenv("TAGMEM_PEER_DIR"), mine.job, mine.uuid);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].pid, taker->pid());
  {
    const int fd = handoff::connect_to(found[0]);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    peers::unix_channel ch(fd, "taker");
    GetParam().forge(mine);
    ch.send(handoff::kHoffHello, handoff::encode_hello({mine, 1}), {}, 5000, "greeting");
    peers::message m = ch.receive(5000, "waiting for the answer");
    EXPECT_EQ(m.type, handoff::kHoffRefuse) << GetParam().what;
    if (m.type == handoff::kHoffRefuse) {
      EXPECT_NE(handoff::decode_refuse(m.payload).reason, "") << GetParam().what;
    }
  }
  taker->channel().send("reload");
  EXPECT_EQ(taker->channel().receive(), "given 0 refused 1 leaks '' fds same corrupted 0");
  EXPECT_EQ(taker->wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Claims, HandoffForgedGiver,
    ::testing::Values(
        forged_hello{"another job", [](handoff::claim& c) { c.job += "-other"; }},
        forged_hello{"another GPU", [](handoff::claim& c) { c.uuid[0] ^= 1; }},
        forged_hello{"another granularity", [](handoff::claim& c) { c.granularity *= 2; }},
        forged_hello{"another pid", [](handoff::claim& c) { c.who.pid = ::getppid(); }},
        forged_hello{"another start", [](handoff::claim& c) { c.who.start += 1; }}),
    [](const auto& info) {
      std::string n = info.param.what;
      for (char& ch : n) ch = ch == ' ' ? '_' : ch;
      return n;
    });

// The test process as a forged taker: a socket named for one pid, served by another; or one
// whose welcome claims another job. The giver sends no descriptor and its memory goes to the
// driver.
struct forged_taker {
  const char* what;
  bool own_pid_in_name;  // else a pid that is not the listener's
  void (*forge)(handoff::claim& c);
};

class HandoffForgedTaker : public HandoffMeet,
                           public ::testing::WithParamInterface<forged_taker> {};

TEST_P(HandoffForgedTaker, GetsNothing) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  handoff::claim mine;
  {
    runtime::hold h;
    device& d = h.core().dev(0);
    mine.job = std::getenv("TAGMEM_JOB");
    std::memcpy(mine.uuid.data(), d.uuid().bytes, 16);
    mine.granularity = d.granularity();
    mine.who = peers::identity_of(::getpid());
  }
  const std::string dir = std::getenv("TAGMEM_PEER_DIR");
  peers::rendezvous_paths paths = handoff::own_point(dir, mine.job, mine.uuid);
  if (!GetParam().own_pid_in_name) {
    const std::string own = std::to_string(::getpid()) + ".sock";
    const std::string other = std::to_string(::getppid()) + ".sock";
    paths.socket.replace(paths.socket.size() - own.size(), own.size(), other);
    paths.lock = paths.socket.substr(0, paths.socket.size() - 5) + ".lock";
    mine.who = peers::identity_of(::getppid());  // the welcome agrees with the name
  }
  GetParam().forge(mine);
  {
    peers::rendezvous_listener listener(paths, 4, "forged taker");
    peer_process giver("discard_giver", "g");
    giver.channel().send(std::to_string(seed_));
    giver.channel().send("offload");
    // Serve one connection: answer the hello, then see what comes.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int fd = -1;
    while (fd < 0 && std::chrono::steady_clock::now() < deadline) {
      fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_GE(fd, 0) << "the giver never connected";
    peers::unix_channel ch(fd, "giver");
    peers::message hello = ch.receive(5000, "waiting for the hello");
    ASSERT_EQ(hello.type, handoff::kHoffHello);
    ch.send(
        handoff::kHoffWelcome,
        handoff::encode_welcome({mine, handoff::taker_state::reloading, 1ull << 40, 1ull << 40, 1}),
        {}, 5000, "welcoming");
    bool gave = false;
    try {
      peers::message m = ch.receive(5000, "waiting for handles");
      gave = m.type == handoff::kHoffGive || !m.fds.empty();
    } catch (const error&) {  // closed: nothing given
    }
    EXPECT_FALSE(gave) << GetParam().what;
    EXPECT_EQ(giver.channel().receive(), "given 0 refused 1 leaks '' fds same");
    EXPECT_EQ(giver.wait(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Claims, HandoffForgedTaker,
    ::testing::Values(forged_taker{"a socket named for another pid", false, [](handoff::claim&) {}},
                      forged_taker{"another job", true,
                                   [](handoff::claim& c) { c.job += "-other"; }},
                      forged_taker{"another GPU", true, [](handoff::claim& c) { c.uuid[3] ^= 8; }}),
    [](const auto& info) {
      std::string n = info.param.what;
      for (char& ch : n) ch = ch == ' ' ? '_' : ch;
      return n;
    });

// tagmem_handoff_expect makes a process take memory without offloaded tags; cancel gives it back.
TEST_F(HandoffMeet, ExpectTakesAndCancelGivesBack) {
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(handoff_stats().listening, 0);
  ASSERT_EQ(tagmem_handoff_expect(0, kPiece), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(handoff_stats().listening, 1);
  {
    peer_process giver("discard_giver", "g");
    giver.channel().send(std::to_string(seed_));
    giver.channel().send("offload");
    // It wants one piece: the other goes to the driver.
    EXPECT_EQ(giver.channel().receive(),
              "given " + std::to_string(kPiece) + " refused 0 leaks '' fds same");
    EXPECT_EQ(giver.wait(), 0);
  }
  EXPECT_EQ(handoff_stats().held_bytes, kPiece);
  ASSERT_EQ(tagmem_handoff_cancel(0), TAGMEM_SUCCESS) << tagmem_last_error();
  const tagmem_handoff_stats s = handoff_stats();
  EXPECT_EQ(s.listening, 0);
  EXPECT_EQ(s.held_bytes, 0u);
  EXPECT_EQ(s.returned_bytes, kPiece);
  ASSERT_EQ(tagmem_wait_released(0), TAGMEM_SUCCESS) << tagmem_last_error();
}

TEST(HandoffOff, CallsFailAndNothingListens) {
  setenv("TAGMEM_HANDOFF", "off", 1);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(tagmem_handoff_expect(0, 0), TAGMEM_ERROR_INVALID_ARGUMENT);
  tagmem_handoff_stats s{};
  EXPECT_EQ(tagmem_handoff_stats_get(0, &s), TAGMEM_ERROR_INVALID_ARGUMENT);
  tagmem_shutdown();
  setenv("TAGMEM_HANDOFF", "on", 1);
}

TEST(HandoffSettings, OnWithoutJobFailsInit) {
  const std::string job = std::getenv("TAGMEM_JOB");
  unsetenv("TAGMEM_JOB");
  const tagmem_status s = tagmem_init(nullptr);
  setenv("TAGMEM_JOB", job.c_str(), 1);
  EXPECT_EQ(s, TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("TAGMEM_JOB"), std::string::npos)
      << tagmem_last_error();
  tagmem_shutdown();
}

}  // namespace
}  // namespace tagmem::handoff_test
