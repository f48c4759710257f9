// rendezvous_test.cpp — how a collective pause/resume fails: missing, dead or disagreeing
// ranks, a directory others may enter, a foreign file where the socket goes, a failed copy, and
// running out of device memory on resume. Every wait is bounded, every message names the
// problem, and a failure before the release leaves every rank exactly as it was.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include "nccl_way.hpp"
#include "peer.hpp"

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

bool mentions(const char* text, const char* part) { return std::strstr(text, part) != nullptr; }

std::string rendezvous_dir() {
  const char* d = std::getenv("TAGMEM_NCCL_DIR");
  return d ? d : "";
}

// The files of `group` in the rendezvous directory.
std::vector<std::string> files_of(const std::string& group) {
  std::vector<std::string> found;
  if (DIR* d = ::opendir(rendezvous_dir().c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(group + "-", 0) == 0) found.push_back(e->d_name);
    ::closedir(d);
  }
  return found;
}

// ---- peers -----------------------------------------------------------------------------------

TAGMEM_PEER_SCENARIO(calls_resume_instead) {
  use_device(1);
  tagmem_status s = shim().resume(args.group.c_str(), 1, 2, 5000);
  bool ok = s == TAGMEM_ERROR_PEER && mentions(shim().last_error(), "called resume while rank 0");
  if (!ok) std::fprintf(stderr, "[peer] got %d: %s\n", s, shim().last_error());
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(says_size_three) {
  use_device(1);
  tagmem_status s = shim().pause(args.group.c_str(), 1, 3, 5000);
  bool ok = s == TAGMEM_ERROR_PEER && mentions(shim().last_error(), "has 3 processes");
  if (!ok) std::fprintf(stderr, "[peer] got %d: %s\n", s, shim().last_error());
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(dies_while_copying) {
  use_device(1);
  filled mine(1, 500, 16 * MiB, 4);
  emu_set_copy_bytes_per_second(8 * MiB);  // its backup takes seconds
  args.channel.send("pausing");
  shim().pause(args.group.c_str(), 1, 2, 20000);
  return 0;  // not reached: the test kills this process while it copies
}

TAGMEM_PEER_SCENARIO(copy_fails_once) {
  use_device(1);
  filled mine(1, 600);
  emu_fail_call("cuMemcpyDtoHAsync", 1, CUDA_ERROR_UNKNOWN);
  tagmem_status s = shim().pause(args.group.c_str(), 1, 2, 10000);
  bool ok = s == TAGMEM_ERROR_DRIVER && mine.intact() && shim_stats().paused == 0;
  ok = ok && shim().pause(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && shim().resume(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS && mine.intact();
  if (!ok) std::fprintf(stderr, "[peer] copy_fails_once: %d %s\n", s, shim().last_error());
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(runs_out_of_memory_on_resume) {
  use_device(1);
  filled mine(1, 700);
  bool ok = shim().pause(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS;
  std::uint64_t full = emu_device_bytes(1);
  emu_set_device_bytes(1, emu_device_used_bytes(1) + 2 * MiB);  // not room for 12 MiB
  tagmem_status s = shim().resume(args.group.c_str(), 1, 2, 10000);
  ok = ok && s == TAGMEM_ERROR_OUT_OF_MEMORY && shim_stats().paused == 1 &&
       shim_stats().backup_bytes == 12 * MiB;
  emu_set_device_bytes(1, full);
  args.channel.send("memory back");
  ok = ok && shim().resume(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS && mine.intact();
  if (!ok) std::fprintf(stderr, "[peer] out of memory: %d %s\n", s, shim().last_error());
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(pauses_twice) {
  use_device(1);
  filled mine(1, 800);
  bool ok = shim().pause(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS;
  tagmem_status again = shim().pause(args.group.c_str(), 1, 2, 10000);
  ok = ok && again == TAGMEM_ERROR_TAG_OFFLOADED && mentions(shim().last_error(), "rank 0");
  ok = ok && shim().resume(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS && mine.intact();
  if (!ok) std::fprintf(stderr, "[peer] pauses_twice: %d %s\n", again, shim().last_error());
  return ok ? 0 : 1;
}

// ---- tests -----------------------------------------------------------------------------------

class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override { use_device(0); }
};

TEST_F(Rendezvous, MissingPeerTimesOutNamingItAndNothingIsReleased) {
  filled mine(0, 100);
  std::string group = unique_group("missing");
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 700), TAGMEM_ERROR_TIMEOUT);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(mentions(shim().last_error(), "rank(s) 1 did not join")) << shim().last_error();
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(shim_stats().paused, 0);
  EXPECT_TRUE(files_of(group).empty()) << "rank 0 removes the socket and lock it created";
}

TEST_F(Rendezvous, MissingRankZeroTimesOutNamingIt) {
  filled mine(0, 110);
  std::string group = unique_group("norank0");
  EXPECT_EQ(shim().pause(group.c_str(), 1, 2, 500), TAGMEM_ERROR_TIMEOUT);
  EXPECT_TRUE(mentions(shim().last_error(), "rank 0 did not open")) << shim().last_error();
  EXPECT_TRUE(mine.intact());
}

TEST_F(Rendezvous, RanksCallingDifferentOperationsBothFail) {
  filled mine(0, 120);
  std::string group = unique_group("disagree");
  peer_process peer("calls_resume_instead", group);
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 5000), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(mentions(shim().last_error(), "called resume while rank 0 called pause"))
      << shim().last_error();
  EXPECT_EQ(peer.wait(), 0);
  EXPECT_TRUE(mine.intact());
}

TEST_F(Rendezvous, RanksDisagreeingOnTheSizeBothFail) {
  std::string group = unique_group("size");
  peer_process peer("says_size_three", group);
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 5000), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(mentions(shim().last_error(), "has 3 processes; rank 0 (pid")) << shim().last_error();
  EXPECT_EQ(peer.wait(), 0);
}

TEST_F(Rendezvous, PeerDyingDuringPauseIsReportedAtOnceAndNothingIsReleased) {
  filled mine(0, 130);
  std::string group = unique_group("dies");
  peer_process peer("dies_while_copying", group);
  peer.channel().expect("pausing");
  auto result = std::async(std::launch::async, [&] {
    tagmem_status s = shim().pause(group.c_str(), 0, 2, 20000);
    return std::make_pair(s, std::string(shim().last_error()));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // it is copying by now
  auto killed = std::chrono::steady_clock::now();
  peer.kill_now();
  auto [status, message] = result.get();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5))
      << "a dead peer is noticed without waiting for the timeout";
  EXPECT_EQ(status, TAGMEM_ERROR_PEER) << message;
  EXPECT_TRUE(mentions(message.c_str(), "rank 1")) << message;
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(shim_stats().paused, 0);
  EXPECT_EQ(shim_stats().backup_bytes, 0u) << "the backup made for the failed pause is given back";
}

TEST_F(Rendezvous, FailedCopyOnOneRankLeavesEveryRankResident) {
  filled mine(0, 140);
  std::string group = unique_group("copyfail");
  peer_process peer("copy_fails_once", group);
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 10000), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(mentions(shim().last_error(), "rank 1 failed while copying")) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(shim_stats().backup_bytes, 0u);
  ASSERT_EQ(shim().pause(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  ASSERT_EQ(shim().resume(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(peer.wait(), 0);
}

TEST_F(Rendezvous, OutOfMemoryOnResumeKeepsEveryRankPausedAndARetryWorks) {
  filled mine(0, 150);
  std::string group = unique_group("oom");
  peer_process peer("runs_out_of_memory_on_resume", group);
  ASSERT_EQ(shim().pause(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(shim().resume(group.c_str(), 0, 2, 10000), TAGMEM_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(mentions(shim().last_error(), "rank 1 failed while rebuilding"))
      << shim().last_error();
  EXPECT_EQ(shim_stats().paused, 1);
  EXPECT_FALSE(readable(mine.buffers[0].va)) << "rebuilt buffers are undone";
  EXPECT_EQ(shim_stats().backup_bytes, 12 * MiB);
  peer.channel().expect("memory back");
  ASSERT_EQ(shim().resume(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(peer.wait(), 0);
}

TEST_F(Rendezvous, PausingTwiceFailsOnEveryRank) {
  filled mine(0, 160);
  std::string group = unique_group("twice");
  peer_process peer("pauses_twice", group);
  ASSERT_EQ(shim().pause(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 10000), TAGMEM_ERROR_TAG_OFFLOADED);
  EXPECT_TRUE(mentions(shim().last_error(), "already paused")) << shim().last_error();
  ASSERT_EQ(shim().resume(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(mine.intact());
  EXPECT_EQ(peer.wait(), 0);
}

TEST_F(Rendezvous, DirectoryOthersMayEnterIsRefused) {
  std::string dir = rendezvous_dir() + "-open-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);  // whatever the umask
  std::string saved = rendezvous_dir();
  ::setenv("TAGMEM_NCCL_DIR", dir.c_str(), 1);
  EXPECT_EQ(shim().pause(unique_group("open").c_str(), 0, 2, 500), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(mentions(shim().last_error(), "has mode 0755")) << shim().last_error();
  std::string link = dir + "-link";
  ASSERT_EQ(::symlink(saved.c_str(), link.c_str()), 0);
  ::setenv("TAGMEM_NCCL_DIR", link.c_str(), 1);
  EXPECT_EQ(shim().pause(unique_group("link").c_str(), 0, 2, 500), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(mentions(shim().last_error(), "symbolic link")) << shim().last_error();
  ::setenv("TAGMEM_NCCL_DIR", saved.c_str(), 1);
  ::unlink(link.c_str());
  ::rmdir(dir.c_str());
}

TEST_F(Rendezvous, AFileThatIsNoSocketWhereTheSocketGoesIsReportedAndKept) {
  std::string group = unique_group("notsock");
  // A rank 1 that waits in vain names the socket it waited for.
  EXPECT_EQ(shim().pause(group.c_str(), 1, 2, 300), TAGMEM_ERROR_TIMEOUT);
  std::string error = shim().last_error();
  auto from = error.find("waited for '");
  ASSERT_NE(from, std::string::npos) << error;
  from += std::strlen("waited for '");
  std::string path = error.substr(from, error.find('\'', from) - from);
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path;
  ::close(fd);
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 300), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(mentions(shim().last_error(), "is no socket")) << shim().last_error();
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << "tagmem must not delete a file it did not create";
  ::unlink(path.c_str());
  EXPECT_TRUE(files_of(group).empty()) << "rank 0 removes the lock it created";
}

}  // namespace
}  // namespace tagmem::preload_test
