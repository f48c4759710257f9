// jobs_test.cpp — a group is one job, whatever the processes around it do: two jobs that use the
// same group name never meet; a process that joins a group it does not belong to (the same job
// identity given to two jobs) is refused, naming both processes, and nothing of one job is
// mapped into the other; a rank 0 killed with SIGKILL while it listens does not keep its
// restarted self from serving the group; and another user who creates the directory tagmem
// once used by default (/tmp/tagmem-<uid>) blocks nothing.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
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

constexpr std::size_t kShared = 2u << 20;
constexpr std::uint64_t kSeedJobA = 0xa11ce, kSeedJobB = 0xb0b;

bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Sets an environment variable for the life of the scope (peers started meanwhile inherit it).
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~scoped_env() {
    if (had_) {
      ::setenv(name_.c_str(), saved_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, saved_;
  bool had_ = false;
};

// The socket file of `group` in the rendezvous directory, if one exists.
std::string socket_of(const std::string& group) {
  const char* dir = std::getenv("TAGMEM_NCCL_DIR");
  if (!dir) return {};
  std::string found;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind(group + "-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".sock")
        found = std::string(dir) + "/" + n;
    }
    ::closedir(d);
  }
  return found;
}

// One process's side of a shared buffer, checked against the bytes its owner wrote.
bool holds_pattern(const buffer& b, std::uint64_t seed) {
  return readable(b.va) && read_bytes(b, 0, b.size) == pattern(seed, b.size);
}

// ---- peers -----------------------------------------------------------------------------------

TAGMEM_PEER_SCENARIO(other_job_rank_one) {
  use_device(1);
  tagmem_status s = shim().pause(args.group.c_str(), 1, 2, 1500);
  std::string m = shim().last_error();
  bool ok = s == TAGMEM_ERROR_TIMEOUT && mentions(m, "rank 0 did not open") &&
            mentions(m, "of job 'other-") && shim_stats().paused == 0;
  if (!ok) std::fprintf(stderr, "[peer] other job: %d %s\n", s, m.c_str());
  return ok ? 0 : 1;
}

// Rank 1 of a job: imports its owner's buffer (fd over the control channel), pauses and
// resumes with it, then waits to be told what to do next.
int importer(peer_args& args, std::uint64_t seed) {
  use_device(1);
  std::vector<int> fds;
  args.channel.receive(&fds);
  if (fds.size() != 1) return 10;
  buffer b = import_buffer(1, fds[0], kShared);
  ::close(fds[0]);
  bool ok = holds_pattern(b, seed);
  ok = ok && shim().pause(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && shim().resume(args.group.c_str(), 1, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && holds_pattern(b, seed);
  if (!ok) std::fprintf(stderr, "[peer] importer: %s\n", shim().last_error());
  args.channel.send(ok ? "shared" : "failed");
  std::string next = args.channel.receive();
  if (next == "cross") {
    // Joins the other job's rank 0 (the same job identity was given to both jobs).
    tagmem_status s = shim().pause(args.group.c_str(), 1, 2, 5000);
    std::string m = shim().last_error();
    bool refused = s == TAGMEM_ERROR_PEER && mentions(m, "not the process it was shared with");
    refused = refused && shim_stats().paused == 0 && holds_pattern(b, seed);
    if (!refused) std::fprintf(stderr, "[peer] crossed: %d %s\n", s, m.c_str());
    ok = ok && refused;
    args.channel.send(ok ? "refused" : "failed");
  }
  free_buffer(b);
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(job_a_importer) { return importer(args, kSeedJobA); }
TAGMEM_PEER_SCENARIO(job_b_importer) { return importer(args, kSeedJobB); }

TAGMEM_PEER_SCENARIO(job_b_owner) {
  use_device(0);
  buffer b = create_buffer(0, kShared, true);
  write_bytes(b, 0, pattern(kSeedJobB, kShared));
  int fd = export_fd(b);
  args.channel.send("fd", {fd});
  ::close(fd);
  bool ok = shim().pause(args.group.c_str(), 0, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && shim().resume(args.group.c_str(), 0, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && holds_pattern(b, kSeedJobB);
  if (!ok) std::fprintf(stderr, "[peer] job b owner: %s\n", shim().last_error());
  args.channel.send(ok ? "shared" : "failed");
  args.channel.expect("end");
  free_buffer(b);
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(listens_until_killed) {
  use_device(0);
  shim().pause(args.group.c_str(), 0, 2, 60000);
  return 0;  // not reached: the test kills it while it waits for rank 1
}

TAGMEM_PEER_SCENARIO(restarted_rank_zero) {
  use_device(0);
  buffer b = create_buffer(0, kShared, false);
  write_bytes(b, 0, pattern(7, kShared));
  bool ok = shim().pause(args.group.c_str(), 0, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && shim().resume(args.group.c_str(), 0, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && holds_pattern(b, 7);
  if (!ok) std::fprintf(stderr, "[peer] restarted rank 0: %s\n", shim().last_error());
  free_buffer(b);
  return ok ? 0 : 1;
}

// A rank of a job started without TAGMEM_NCCL_DIR or XDG_RUNTIME_DIR: it inherits the directory
// its launcher chose when it loaded the shim.
int fresh_rank(peer_args& args, int rank) {
  use_device(rank);
  const char* dir = std::getenv("TAGMEM_NCCL_DIR");
  std::string old = "/tmp/tagmem-" + std::to_string(::geteuid());
  if (!dir || old == dir) return 20;
  buffer b = create_buffer(rank, kShared, false);
  write_bytes(b, 0, pattern(40 + rank, kShared));
  bool ok = shim().pause(args.group.c_str(), rank, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && shim().resume(args.group.c_str(), rank, 2, 10000) == TAGMEM_SUCCESS;
  ok = ok && holds_pattern(b, 40 + rank);
  if (!ok) std::fprintf(stderr, "[peer] fresh rank %d: %s\n", rank, shim().last_error());
  free_buffer(b);
  return ok ? 0 : 1;
}

TAGMEM_PEER_SCENARIO(fresh_rank_zero) { return fresh_rank(args, 0); }
TAGMEM_PEER_SCENARIO(fresh_rank_one) { return fresh_rank(args, 1); }

TAGMEM_PEER_SCENARIO(launcher) {
  peer_process r0("fresh_rank_zero", args.group), r1("fresh_rank_one", args.group);
  int a = r0.wait(30000), b = r1.wait(30000);
  if (a != 0 || b != 0) std::fprintf(stderr, "[peer] launcher: ranks exited %d, %d\n", a, b);
  return a == 0 && b == 0 ? 0 : 1;
}

// ---- tests -----------------------------------------------------------------------------------

TEST(Jobs, TwoJobsWithTheSameGroupNameNeverMeet) {
  use_device(0);
  std::string group = unique_group("samename");
  std::string other = "other-" + std::to_string(::getpid());
  std::unique_ptr<peer_process> peer;
  {
    scoped_env job("TAGMEM_NCCL_JOB", other.c_str());
    peer = std::make_unique<peer_process>("other_job_rank_one", group);
  }
  EXPECT_EQ(shim().pause(group.c_str(), 0, 2, 1500), TAGMEM_ERROR_TIMEOUT) << shim().last_error();
  EXPECT_TRUE(mentions(shim().last_error(), "rank(s) 1 did not join")) << shim().last_error();
  EXPECT_EQ(shim_stats().paused, 0);
  EXPECT_EQ(peer->wait(), 0);
}

TEST(Jobs, AProcessOfAnotherJobInTheGroupIsRefusedAndNothingIsMapped) {
  use_device(0);
  std::string group = unique_group("crossed");
  // Job A: this process owns a buffer that A's rank 1 maps; they pause and resume together.
  buffer mine = create_buffer(0, kShared, true);
  write_bytes(mine, 0, pattern(kSeedJobA, kShared));
  peer_process a1("job_a_importer", group);
  int fd = export_fd(mine);
  a1.channel().send("fd", {fd});
  ::close(fd);
  ASSERT_EQ(shim().pause(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  ASSERT_EQ(shim().resume(group.c_str(), 0, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  a1.channel().expect("shared");
  // Job B, given the same job identity and group name, does the same afterwards.
  peer_process b0("job_b_owner", group), b1("job_b_importer", group);
  std::vector<int> fds;
  ASSERT_EQ(b0.channel().receive(&fds), "fd");
  ASSERT_EQ(fds.size(), 1u);
  b1.channel().send("fd", fds);
  ::close(fds[0]);
  b0.channel().expect("shared");
  b1.channel().expect("shared");
  // B's rank 1 now pauses with A's rank 0.
  b1.channel().send("cross");
  tagmem_status s = shim().pause(group.c_str(), 0, 2, 5000);
  std::string m = shim().last_error();
  EXPECT_EQ(s, TAGMEM_ERROR_PEER) << m;
  EXPECT_TRUE(mentions(m, "not the process it was shared with")) << m;
  EXPECT_TRUE(mentions(m, "pid " + std::to_string(b1.pid()))) << m;
  EXPECT_TRUE(mentions(m, "pid " + std::to_string(b0.pid()))) << m;
  EXPECT_TRUE(mentions(m, "pid " + std::to_string(::getpid()))) << m;
  EXPECT_EQ(shim_stats().paused, 0);
  EXPECT_TRUE(holds_pattern(mine, kSeedJobA));
  if (s == TAGMEM_SUCCESS) shim().resume(group.c_str(), 0, 2, 5000);  // let the peer finish
  b1.channel().expect("refused");
  EXPECT_EQ(b1.wait(), 0);
  b0.channel().send("end");
  EXPECT_EQ(b0.wait(), 0);
  a1.channel().send("end");
  EXPECT_EQ(a1.wait(), 0);
  free_buffer(mine);
}

TEST(Jobs, RankZeroKilledWhileListeningCanBeRestarted) {
  use_device(1);
  std::string group = unique_group("restart");
  {
    peer_process first("listens_until_killed", group);
    for (int i = 0; i < 1000 && socket_of(group).empty(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_FALSE(socket_of(group).empty()) << "rank 0 never listened";
    first.kill_now();
  }
  ASSERT_FALSE(socket_of(group).empty()) << "the killed rank 0 leaves its socket file";
  peer_process again("restarted_rank_zero", group);
  buffer b = create_buffer(1, kShared, false);
  write_bytes(b, 0, pattern(8, kShared));
  EXPECT_EQ(shim().pause(group.c_str(), 1, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_EQ(shim().resume(group.c_str(), 1, 2, 10000), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_TRUE(holds_pattern(b, 8));
  EXPECT_EQ(again.wait(), 0);
  free_buffer(b);
}

TEST(Jobs, AnotherUserOwningTheOldDefaultDirectoryBlocksNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "creating a directory as another user needs root";
  std::string old = "/tmp/tagmem-" + std::to_string(::geteuid());
  std::string moved = old + ".moved-" + std::to_string(::getpid());
  bool had = ::rename(old.c_str(), moved.c_str()) == 0;
  ASSERT_EQ(::mkdir(old.c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(::chown(old.c_str(), 65534, 65534), 0) << std::strerror(errno);  // nobody's now
  int rc = -1;
  {
    scoped_env no_dir("TAGMEM_NCCL_DIR", nullptr), no_xdg("XDG_RUNTIME_DIR", nullptr);
    peer_process launcher("launcher", unique_group("squat"));
    rc = launcher.wait(60000);
  }
  ::rmdir(old.c_str());
  if (had) ::rename(moved.c_str(), old.c_str());
  EXPECT_EQ(rc, 0) << "a job started without TAGMEM_NCCL_DIR and XDG_RUNTIME_DIR could not pause";
}

TEST(Jobs, WithoutAJobIdentityTheCallNamesTheSetting) {
  scoped_env a("TAGMEM_NCCL_JOB", nullptr), b("TORCHELASTIC_RUN_ID", "none"),
      c("SLURM_JOB_ID", nullptr), e("TAGMEM_JOB", nullptr);
  EXPECT_EQ(shim().pause(nullptr, 0, 1, 500), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(shim().last_error(), "set TAGMEM_JOB")) << shim().last_error();
  scoped_env d("TORCHELASTIC_RUN_ID", "3f6c-run");
  ASSERT_EQ(shim().pause(nullptr, 0, 1, 500), TAGMEM_SUCCESS) << shim().last_error();
  ASSERT_EQ(shim().resume(nullptr, 0, 1, 500), TAGMEM_SUCCESS) << shim().last_error();
}

}  // namespace
}  // namespace tagmem::preload_test
