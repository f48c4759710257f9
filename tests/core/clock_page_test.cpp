// clock_page_test.cpp — the page through which processes share the release clock, as an
// attacker or an unlucky user leaves it (Note [clock page] in allocator/device/clock_page.hpp):
// hard links, wrong modes and sizes, other owners, symlinks, FIFOs, truncation while in use, and
// hostile values, none of which may crash, hang, overflow or write to a file that is not the page.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "device/release_clock.hpp"
#include "observe/log.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
constexpr std::size_t GiB = std::size_t{1} << 30;

class ClockPage : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tagmem-clock-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/clock";
    set_log_sink_for_testing([this](const std::string& l) { lines_.push_back(l); });
  }
  void TearDown() override {
    release_clock::share_through("");
    release_clock::reset();
    set_log_sink_for_testing({});
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  // A file of `bytes` random bytes with `mode` at `at`; returns them.
  std::vector<unsigned char> plant(const std::string& at, std::size_t bytes, mode_t mode) {
    auto rng = rng_for_test();
    std::vector<unsigned char> data = random_bytes(rng, bytes);
    const int fd = open(at.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, data.data(), bytes), ssize_t(bytes));
    fchmod(fd, mode);
    close(fd);
    return data;
  }
  static std::vector<unsigned char> contents(const std::string& at) {
    std::vector<unsigned char> out(4096);
    const int fd = open(at.c_str(), O_RDONLY);
    if (fd < 0) return {};
    const ssize_t n = read(fd, out.data(), out.size());
    close(fd);
    out.resize(n < 0 ? 0 : n);
    return out;
  }
  // Refused, with one line naming the page and `reason`; the clock still works in-process.
  void expect_refused(const std::string& reason) {
    lines_.clear();
    EXPECT_FALSE(release_clock::share_through(path_));
    ASSERT_EQ(lines_.size(), 1u);
    EXPECT_NE(lines_[0].find(path_), std::string::npos) << lines_[0];
    EXPECT_NE(lines_[0].find(reason), std::string::npos) << lines_[0];
    release_clock::note(60 * GiB);
    EXPECT_TRUE(release_clock::after_release());
    release_clock::reset();
  }
  void write_value(std::int64_t v) {
    const int fd = open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, &v, sizeof v, 0), ssize_t(sizeof v));
    close(fd);
  }

  std::string dir_, path_;
  std::vector<std::string> lines_;
};

TEST_F(ClockPage, IsCreatedExclusivelyAsOneLinkOf8BytesMode0600) {
  const mode_t old_umask = umask(0);  // a permissive umask must not widen it
  const bool shared = release_clock::share_through(path_);
  umask(old_umask);
  ASSERT_TRUE(shared);
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(st.st_size, 8);
  release_clock::note(60 * GiB);
  EXPECT_TRUE(release_clock::after_release());
  // A second opener of the same page sees it.
  ASSERT_TRUE(release_clock::share_through(path_));
  EXPECT_TRUE(release_clock::after_release());
  EXPECT_TRUE(lines_.empty());
}

TEST_F(ClockPage, RefusesAHardLinkAndNeverWritesTheLinkedFile) {
  const std::string victim = dir_ + "/victim";
  const auto before = plant(victim, 8, 0600);  // looks exactly like a page
  ASSERT_EQ(link(victim.c_str(), path_.c_str()), 0);
  expect_refused("2 links");
  EXPECT_EQ(contents(victim), before);
}

TEST_F(ClockPage, RefusesWrongSizesAndModes) {
  plant(path_, 16, 0600);
  expect_refused("16 bytes");
  unlink(path_.c_str());
  plant(path_, 0, 0600);
  expect_refused("0 bytes");
  unlink(path_.c_str());
  plant(path_, 8, 0644);
  expect_refused("mode 0644");
  unlink(path_.c_str());
  plant(path_, 8, 0606);
  expect_refused("mode 0606");
}

TEST_F(ClockPage, RefusesSymlinksDirectoriesAndFifosWithoutHanging) {
  const std::string target = dir_ + "/target";
  const auto before = plant(target, 8, 0600);
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  expect_refused("cannot open");
  EXPECT_EQ(contents(target), before);
  unlink(path_.c_str());
  ASSERT_EQ(mkdir(path_.c_str(), 0700), 0);
  expect_refused("cannot open");
  rmdir(path_.c_str());
  ASSERT_EQ(mkfifo(path_.c_str(), 0600), 0);  // opened without O_NONBLOCK this would block
  expect_refused("not a regular file");
}

TEST_F(ClockPage, RefusesAnotherUsersPage) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the page to another user";
  plant(path_, 8, 0600);
  ASSERT_EQ(chown(path_.c_str(), 65534, 65534), 0);
  expect_refused("owned by uid 65534");
}

TEST_F(ClockPage, SurvivesTruncationAndGrowthWhileInUse) {
  ASSERT_TRUE(release_clock::share_through(path_));
  release_clock::note(60 * GiB);
  ASSERT_EQ(truncate(path_.c_str(), 0), 0);  // a mapped page would now raise SIGBUS
  EXPECT_EQ(release_clock::owed().count(), 0);
  release_clock::note(60 * GiB);  // writes the 8 bytes again
  EXPECT_TRUE(release_clock::after_release());
  ASSERT_EQ(truncate(path_.c_str(), 1 << 20), 0);
  EXPECT_TRUE(release_clock::after_release());
  EXPECT_LE(release_clock::owed(), release_clock::longest);
}

TEST_F(ClockPage, ClampsHostileValues) {
  ASSERT_TRUE(release_clock::share_through(path_));
  const std::int64_t now =
      std::chrono::duration_cast<nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  for (std::int64_t v : {INT64_MAX, INT64_MIN, INT64_MIN + 1, std::int64_t(-1),
                         now + std::int64_t(3600) * 1000000000, INT64_MAX - 1}) {
    write_value(v);
    const nanoseconds o = release_clock::owed();
    EXPECT_GE(o.count(), 0) << v;
    EXPECT_LE(o, release_clock::longest) << v;
    release_clock::note(GiB);  // no signed overflow adding to it (UBSan builds check)
    EXPECT_LE(release_clock::owed(), release_clock::longest) << v;
    EXPECT_GE(release_clock::owed().count(), 0) << v;
  }
}

TEST_F(ClockPage, IsSharedWithAnotherProcess) {
  ASSERT_TRUE(release_clock::share_through(path_));
  ASSERT_FALSE(release_clock::after_release());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const bool ok = release_clock::share_through(path_);
    release_clock::note(60 * GiB);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(release_clock::after_release());
}

// A sweep over what another process may do to the page between two uses: truncate or grow it to
// a random size, write random bytes anywhere in its first 16, replace it, take it away. Whatever
// it holds, the clock owes between 0 and `longest`, and a process opening it afresh either shares
// it or refuses it with a line.
TEST_F(ClockPage, RandomStatesAndValuesKeepTheClockInBounds) {
  auto rng = rng_for_test();
  ASSERT_TRUE(release_clock::share_through(path_));
  for (int step = 0; step < 400; ++step) {
    switch (rng() % 6) {
      case 0:
        ASSERT_EQ(truncate(path_.c_str(), off_t(rng() % 24)), 0);
        break;
      case 1: {
        const auto bytes = random_bytes(rng, 1 + rng() % 8);
        const int fd = open(path_.c_str(), O_WRONLY);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), off_t(rng() % 9)), ssize_t(bytes.size()));
        close(fd);
        break;
      }
      case 2:
        release_clock::note(std::size_t(rng() % (100 * GiB)));
        break;
      case 3:
        release_clock::reset();
        break;
      case 4: {  // reopen, as a new process would
        lines_.clear();
        const bool shared = release_clock::share_through(path_);
        EXPECT_EQ(lines_.size(), shared ? 0u : 1u);
        if (!shared) {  // refused (wrong size): put a good page back
          unlink(path_.c_str());
          ASSERT_TRUE(release_clock::share_through(path_));
        }
        break;
      }
      default:
        break;
    }
    const nanoseconds o = release_clock::owed();
    ASSERT_GE(o.count(), 0) << "step " << step;
    ASSERT_LE(o, release_clock::longest) << "step " << step;
  }
}

}  // namespace
}  // namespace tagmem::test
