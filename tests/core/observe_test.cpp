// observe_test.cpp — TAGMEM_LOG's lines and the out-of-memory message: each line names the tags
// and carries the bytes, free memory and pinned host bytes that the statistics show right after
// the switch; a reload that runs out of device memory says which tag, how much, what is free,
// what is resident, and that the tag keeps its backup.
#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "observe/log.hpp"
#include "observe/log_stamp.hpp"
#include "peers/group.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

// Restarts tagmem with TAGMEM_LOG=info and collects its lines for the test's lifetime.
class Observe : public tagmem_test {
 protected:
  void SetUp() override {
    tagmem_test::SetUp();
    ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
    setenv("TAGMEM_LOG", "info", 1);
    // Releases on the calling thread, so that a line's memory figures are still exact when the
    // test reads the statistics after the call.
    setenv("TAGMEM_DISCARD_RELEASE", "wait", 1);
    setenv("TAGMEM_SWAP_RELEASE", "inline", 1);
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    set_log_sink_for_testing([this](const std::string& l) {
      std::lock_guard lock(mutex_);
      lines_.push_back(l);
    });
  }
  void TearDown() override {
    set_log_sink_for_testing({});
    unsetenv("TAGMEM_LOG");
    unsetenv("TAGMEM_DISCARD_RELEASE");
    unsetenv("TAGMEM_SWAP_RELEASE");
    tagmem_test::TearDown();
  }
  std::vector<std::string> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(lines_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// "tagmem: 2026-12-02T13:40:01.123Z pid=1234 [rank=3] " at the start of `line`, with this
// process's pid and, when `rank` >= 0, that rank.
const std::regex& stamp_pattern() {
  static const std::regex re(
      R"(^tagmem: (\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z pid=(\d+)( rank=(\d+))? )");
  return re;
}

// `line` without its stamp ("tagmem: " + the rest), after checking the stamp.
std::string unstamped(const std::string& line, int rank = -1) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(line, m, stamp_pattern())) << line;
  if (m.empty()) return line;
  EXPECT_EQ(std::stol(m[8].str()), static_cast<long>(getpid())) << line;
  EXPECT_EQ(m[9].matched, rank >= 0) << line;
  if (rank >= 0) {
    EXPECT_EQ(m[10].str(), std::to_string(rank)) << line;
  }
  return "tagmem: " + line.substr(m.length(0));
}

// "tagmem: <stamp> swap device=0 a=b ... error=\"...\"" -> {"event": "swap", "a": "b", ...}.
std::map<std::string, std::string> fields(const std::string& stamped) {
  std::map<std::string, std::string> out;
  const std::string line = unstamped(stamped);
  EXPECT_EQ(line.rfind("tagmem: ", 0), 0u) << line;
  EXPECT_EQ(line.back(), '\n') << line;
  std::string body = line.substr(8, line.size() - 9);
  const std::size_t err = body.find(" error=\"");
  if (err != std::string::npos) {
    out["error"] = body.substr(err + 8, body.size() - err - 9);
    body = body.substr(0, err);
  }
  std::istringstream in(body);
  std::string word;
  in >> out["event"];
  while (in >> word) {
    if (word == "FAILED") {
      out["failed"] = "1";
      continue;
    }
    const std::size_t eq = word.find('=');
    EXPECT_NE(eq, std::string::npos) << word << " in " << line;
    out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

std::uint64_t num(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  EXPECT_NE(it, f.end()) << key;
  return it == f.end() ? ~0ull : std::stoull(it->second);
}

tagmem_tag_stats stats_of(const char* tag) {
  tagmem_tag_stats s{};
  EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s;
}

tagmem_device_stats device_stats() {
  tagmem_device_stats s{};
  EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s;
}

// The line's free memory, pinned and used host bytes are what the statistics say just after.
void expect_memory_now(const std::map<std::string, std::string>& f) {
  const tagmem_device_stats d = device_stats();
  if (using_emulator()) {
    EXPECT_EQ(num(f, "device_free"), d.device_free_bytes);
  }
  EXPECT_EQ(num(f, "host_pinned"), d.host_pinned_bytes);
  EXPECT_EQ(num(f, "host_used"), d.host_used_bytes);
  EXPECT_EQ(num(f, "release_pending"), d.release_pending_bytes);
}

TEST_F(Observe, OneLinePerOffloadReloadAndSwapWithItsTagsAndBytes) {
  auto rng = rng_for_test();
  std::uniform_int_distribution<int> count(3, 12);
  auto a = fill(rng, "alpha", count(rng), (1 + rng() % 5) << 20);
  auto b = fill(rng, "beta", count(rng), (1 + rng() % 7) << 20);
  take();
  const char* alpha[] = {"alpha"};
  const char* beta[] = {"beta"};
  const tagmem_tag_stats a0 = stats_of("alpha");

  TAGMEM_OK(tagmem_offload(alpha, 1, 0, TAGMEM_BACKUP));
  auto lines = take();
  ASSERT_EQ(lines.size(), 1u);
  auto f = fields(lines[0]);
  EXPECT_EQ(f["event"], "offload");
  EXPECT_EQ(f["mode"], "backup");
  EXPECT_EQ(f["out"], "alpha");
  EXPECT_EQ(f.count("in"), 0u);
  EXPECT_EQ(num(f, "out_bytes"), a0.mapped_bytes);
  const tagmem_tag_stats a1 = stats_of("alpha");
  EXPECT_EQ(num(f, "copied_bytes"), a1.bytes_offloaded);
  EXPECT_GT(a1.bytes_offloaded, 0u);
  EXPECT_GE(std::stod(f["ms"]), 0.0);
  EXPECT_GE(std::stod(f["GBps"]), 0.0);
  expect_memory_now(f);

  const tagmem_tag_stats b0 = stats_of("beta");
  TAGMEM_OK(tagmem_swap(beta, 1, alpha, 1, 0, TAGMEM_DISCARD));
  lines = take();
  ASSERT_EQ(lines.size(), 1u);
  f = fields(lines[0]);
  EXPECT_EQ(f["event"], "swap");
  EXPECT_EQ(f["mode"], "discard");
  EXPECT_EQ(f["out"], "beta");
  EXPECT_EQ(f["in"], "alpha");
  EXPECT_EQ(num(f, "out_bytes"), b0.mapped_bytes);
  EXPECT_EQ(num(f, "in_bytes"), stats_of("alpha").mapped_bytes);
  EXPECT_EQ(num(f, "copied_bytes"), stats_of("alpha").bytes_reloaded);  // DISCARD copies none out
  expect_memory_now(f);
  EXPECT_EQ(corrupted(a), 0u);

  TAGMEM_OK(tagmem_reload(beta, 1, 0));
  lines = take();
  ASSERT_EQ(lines.size(), 1u);
  f = fields(lines[0]);
  EXPECT_EQ(f["event"], "reload");
  EXPECT_EQ(f["in"], "beta");
  EXPECT_EQ(f.count("out"), 0u);
  EXPECT_EQ(num(f, "in_bytes"), b0.mapped_bytes);
  EXPECT_EQ(num(f, "copied_bytes"), 0u);  // its contents were discarded
  expect_memory_now(f);
  for (auto* all : {&a, &b})
    for (auto& x : *all) TAGMEM_OK(tagmem_free(x.ptr, nullptr));
}

TEST_F(Observe, AReloadOutOfMemoryNamesTagSizesFreeMemoryAndTheLargestResidentTags) {
  auto rng = rng_for_test();
  const std::size_t n = (32 + rng() % 64) << 20;
  auto victim = fill(rng, "victim", 1, n);
  const char* tags[] = {"victim"};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  const tagmem_tag_stats off = stats_of("victim");
  // Two resident tags, the larger filling all but 16 MiB of the device.
  void* small = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&small, 8 << 20, "small", 0, nullptr));
  const std::size_t hog_size = (device_free_bytes() - (16u << 20)) / (2u << 20) * (2u << 20);
  void* hog = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&hog, hog_size, "hog", 0, nullptr));
  const std::size_t free_full = device_free_bytes();
  take();

  TAGMEM_FAILS_WITH(tagmem_reload(tags, 1, 0), TAGMEM_ERROR_OUT_OF_MEMORY);
  const std::string msg = tagmem_last_error();
  EXPECT_NE(
      msg.find("reload of tag 'victim' needs " + std::to_string(off.reserved_bytes) + " bytes"),
      std::string::npos)
      << msg;
  if (using_emulator()) {
    EXPECT_NE(msg.find(" has " + std::to_string(free_full) + " of "), std::string::npos) << msg;
  }
  const std::size_t hog_at = msg.find("'hog' " + std::to_string(stats_of("hog").mapped_bytes));
  const std::size_t small_at =
      msg.find("'small' " + std::to_string(stats_of("small").mapped_bytes));
  EXPECT_NE(hog_at, std::string::npos) << msg;
  EXPECT_NE(small_at, std::string::npos) << msg;
  EXPECT_LT(hog_at, small_at) << "largest first: " << msg;
  EXPECT_NE(msg.find("'victim' stays offloaded with its backup"), std::string::npos) << msg;
  EXPECT_EQ(stats_of("victim").state, TAGMEM_OFFLOADED_BACKUP);

  // The log has the failed reload, with the tag's state after it, and the explained error.
  const auto lines = take();
  ASSERT_EQ(lines.size(), 2u);
  auto f = fields(lines[0]);
  EXPECT_EQ(f["event"], "reload");
  EXPECT_EQ(f["failed"], "1");
  EXPECT_EQ(f["states"], "victim:offloaded_backup");
  EXPECT_NE(f["error"].find("OUT_OF_MEMORY"), std::string::npos) << lines[0];
  EXPECT_EQ(unstamped(lines[1]), "tagmem: out of memory: " + msg + "\n");

  TAGMEM_OK(tagmem_free(hog, nullptr));
  TAGMEM_OK(tagmem_empty_cache(0));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(victim), 0u);
  for (auto& x : victim) TAGMEM_OK(tagmem_free(x.ptr, nullptr));
  TAGMEM_OK(tagmem_free(small, nullptr));
}

TEST_F(Observe, AnAllocationOutOfMemoryNamesTheTagAndTheBytesAskedFor) {
  const std::size_t free_now = device_free_bytes();
  void* hog = nullptr;
  const std::size_t hog_size = (free_now - (64u << 20)) / (2u << 20) * (2u << 20);
  TAGMEM_OK(tagmem_malloc_tagged(&hog, hog_size, "hog", 0, nullptr));
  void* p = nullptr;
  const std::size_t want = 256u << 20;
  TAGMEM_FAILS_WITH(tagmem_malloc_tagged(&p, want, "wants", 0, nullptr),
                    TAGMEM_ERROR_OUT_OF_MEMORY);
  const std::string msg = tagmem_last_error();
  EXPECT_NE(msg.find("allocation in tag 'wants' needs " + std::to_string(want) + " bytes"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("'hog' " + std::to_string(stats_of("hog").mapped_bytes) + " bytes"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("stays offloaded"), std::string::npos) << msg;
  TAGMEM_OK(tagmem_free(hog, nullptr));
}

// The trace is written on demand, whole, with the switch's span naming its tags' counters; a
// path that cannot be written is an error naming it, and nothing else changes.
TEST_F(Observe, TraceFlushWritesTheSwitchesSoFarAndReportsAnUnwritablePath) {
  auto rng = rng_for_test();
  const std::string path =
      ::testing::TempDir() + "tagmem_observe_" + std::to_string(rng()) + ".json";
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  scoped_env trace("TAGMEM_TRACE", path.c_str());
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  const std::string tag = "traced_" + std::to_string(rng() % 100000);
  auto a = fill(rng, tag.c_str(), 1 + rng() % 4, (1 + rng() % 4) << 20);
  const char* tags[] = {tag.c_str()};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_trace_flush());
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\"", 0), 0u);
  EXPECT_EQ(text.substr(text.size() - 3), "]}\n");
  EXPECT_NE(text.find("{\"name\":\"offload\""), std::string::npos);
  EXPECT_NE(text.find("{\"name\":\"reload\""), std::string::npos);
  EXPECT_NE(text.find("\"name\":\"mapped_bytes " + tag + "\",\"ph\":\"C\""), std::string::npos);
  EXPECT_NE(text.find("\"tag\":\"" + tag + "\""), std::string::npos);
  EXPECT_EQ(corrupted(a), 0u);
  std::remove(path.c_str());
  for (auto& x : a) TAGMEM_OK(tagmem_free(x.ptr, nullptr));

  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  const std::string bad = "/nonexistent-dir-" + std::to_string(rng()) + "/trace.json";
  scoped_env bad_trace("TAGMEM_TRACE", bad.c_str());
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  TAGMEM_FAILS_WITH(tagmem_trace_flush(), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find(bad), std::string::npos) << tagmem_last_error();
  auto b = fill(rng, tag.c_str(), 1 + rng() % 4, (1 + rng() % 4) << 20);
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));  // tracing goes on regardless
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  EXPECT_EQ(corrupted(b), 0u);
  for (auto& x : b) TAGMEM_OK(tagmem_free(x.ptr, nullptr));
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);  // the unwritable trace does not fail shutdown
}

// Event times are the machine's monotonic clock (CLOCK_MONOTONIC, in microseconds), the same in
// every process, so that the traces of a trainer and an engine opened together line up.
TEST_F(Observe, TraceTimesAreTheMachinesMonotonicClock) {
  auto rng = rng_for_test();
  const std::string path =
      ::testing::TempDir() + "tagmem_trace_clock_" + std::to_string(rng()) + ".json";
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  scoped_env trace("TAGMEM_TRACE", path.c_str());
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  const std::string tag = "clocked_" + std::to_string(rng() % 100000);
  auto a = fill(rng, tag.c_str(), 1 + rng() % 3, (1 + rng() % 4) << 20);
  const char* tags[] = {tag.c_str()};
  auto monotonic_us = [] {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
  };
  const double before = monotonic_us();
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  const double after = monotonic_us();
  TAGMEM_OK(tagmem_trace_flush());
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* span : {"{\"name\":\"offload\"", "{\"name\":\"reload\""}) {
    const std::size_t at = text.find(span);
    ASSERT_NE(at, std::string::npos) << span;
    const std::size_t ts = text.find("\"ts\":", at);
    ASSERT_NE(ts, std::string::npos) << span;
    const double t = std::strtod(text.c_str() + ts + 5, nullptr);
    EXPECT_GE(t, before - 1) << span;  // %.3f rounding
    EXPECT_LE(t, after + 1) << span;
  }
  EXPECT_EQ(corrupted(a), 0u);
  for (auto& x : a) TAGMEM_OK(tagmem_free(x.ptr, nullptr));
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  std::remove(path.c_str());
}

// "%p" in TAGMEM_TRACE names this process's pid, so the processes of a job that share one
// setting write one trace each; "%%" is a literal "%".
TEST_F(Observe, TracePathNamesThePidWherePercentPStands) {
  auto rng = rng_for_test();
  const std::string stem = ::testing::TempDir() + "tagmem_trace_pid_" + std::to_string(rng());
  const std::string want = stem + "_" + std::to_string(getpid()) + "_%p.json";
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  scoped_env trace("TAGMEM_TRACE", (stem + "_%p_%%p.json").c_str());
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  const std::string tag = "pid_traced_" + std::to_string(rng() % 100000);
  auto a = fill(rng, tag.c_str(), 1 + rng() % 3, (1 + rng() % 4) << 20);
  const char* tags[] = {tag.c_str()};
  TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(tags, 1, 0));
  TAGMEM_OK(tagmem_trace_flush());
  std::ifstream in(want);
  ASSERT_TRUE(in) << want;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"tag\":\"" + tag + "\""), std::string::npos);
  EXPECT_FALSE(std::ifstream(stem + "_%p_%%p.json")) << "the unexpanded name was written";
  EXPECT_EQ(corrupted(a), 0u);
  for (auto& x : a) TAGMEM_OK(tagmem_free(x.ptr, nullptr));
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  std::remove(want.c_str());
}

// Symlinks planted where the trace and a predictable temporary file would go (another user's, in
// /tmp) are replaced or ignored, never followed: the file they point to keeps its bytes, the
// trace is a regular file of mode 0600, and no temporary file is left beside it.
TEST_F(Observe, TraceFlushNeverFollowsAPlantedSymlink) {
  auto rng = rng_for_test();
  const std::string dir = ::testing::TempDir() + "tagmem_trace_" + std::to_string(rng());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string path = dir + "/tagmem.json", victim = dir + "/victim";
  const std::vector<unsigned char> before = random_bytes(rng, 4096);
  {
    std::ofstream out(victim, std::ios::binary);
    out.write(reinterpret_cast<const char*>(before.data()), before.size());
  }
  // The names a trace's temporary file could be given without a random part, and the path.
  for (const std::string& name : {path + ".tmp" + std::to_string(getpid()), path + ".tmp", path})
    ASSERT_EQ(symlink(victim.c_str(), name.c_str()), 0) << name;
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  scoped_env trace("TAGMEM_TRACE", path.c_str());
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  TAGMEM_OK(tagmem_trace_flush());
  TAGMEM_OK(tagmem_trace_flush());  // again, over the trace it wrote
  std::ifstream in(victim, std::ios::binary);
  const std::vector<unsigned char> after((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
  EXPECT_EQ(after, before);
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  std::ifstream t(path);
  const std::string text((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\"", 0), 0u);
  int entries = 0;  // victim, the trace and the two planted temporary names
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
    closedir(d);
  }
  EXPECT_EQ(entries, 4);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  std::system(("rm -rf '" + dir + "'").c_str());
}

// A directory holding a FIFO, the FIFO's read end open (non-blocking, so that a write never
// waits for a reader), and tagmem restarted with TAGMEM_TRACE naming the FIFO.
struct traced_fifo {
  std::string dir, path;
  int reader = -1;
  std::optional<scoped_env> trace;
  ~traced_fifo() {
    if (reader >= 0) ::close(reader);
    if (!dir.empty()) std::system(("rm -rf '" + dir + "'").c_str());
  }
};

void open_traced_fifo(std::uint64_t id, traced_fifo& f) {
  const std::string dir = ::testing::TempDir() + "tagmem_trace_fifo_" + std::to_string(id);
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  f.dir = dir;
  f.path = dir + "/trace.pipe";
  ASSERT_EQ(mkfifo(f.path.c_str(), 0600), 0);
  f.reader = ::open(f.path.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(f.reader, 0);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  f.trace.emplace("TAGMEM_TRACE", f.path.c_str());
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
}

// A FIFO at the trace's path (as /dev/null is a device) is written into, never replaced: a rename
// over TAGMEM_TRACE=/dev/null in a process run as root left a regular file there, and every
// later `> /dev/null` on the machine filled memory.
TEST_F(Observe, TraceFlushWritesIntoAFifoAndLeavesItThere) {
  auto rng = rng_for_test();
  // The reader is open before the flush, so the write neither waits nor fails; the trace of a
  // process that moved nothing is far smaller than a pipe's buffer.
  traced_fifo fifo;
  open_traced_fifo(rng(), fifo);
  const std::string& path = fifo.path;
  TAGMEM_OK(tagmem_trace_flush());
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fifo.reader, buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
  ::close(fifo.reader);
  fifo.reader = -1;
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\"", 0), 0u) << text;
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  // With no reader the flush fails with a message instead of waiting.
  tagmem_status none = tagmem_trace_flush();
  EXPECT_EQ(none, TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("reader"), std::string::npos);
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);  // the failing trace does not fail shutdown
}

// A FIFO's reader that goes away while the trace is written: the write fails with a message and
// the process goes on (the SIGPIPE it raises does not end it). The pipe is cut to one page, which
// the trace of twenty phase switches overfills, and the reader closes once the page is full.
TEST_F(Observe, TraceFlushSurvivesAFifoReaderThatGoesAway) {
  auto rng = rng_for_test();
  traced_fifo fifo;
  open_traced_fifo(rng(), fifo);
  const int page = static_cast<int>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(fcntl(fifo.reader, F_SETPIPE_SZ, page), page);
  const std::string tag = "gone_" + std::to_string(rng() % 100000);
  auto a = fill(rng, tag.c_str(), 3, 1 << 20);
  const char* tags[] = {tag.c_str()};
  for (int i = 0; i < 20; ++i) {
    TAGMEM_OK(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(tags, 1, 0));
  }
  std::thread leaves([&] {
    int queued = 0;
    for (int i = 0; i < 10000 && queued < page; ++i) {
      ioctl(fifo.reader, FIONREAD, &queued);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::close(fifo.reader);
    fifo.reader = -1;
  });
  const tagmem_status st = tagmem_trace_flush();
  leaves.join();
  EXPECT_EQ(st, TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tagmem_last_error()).find("cannot write"), std::string::npos);
  EXPECT_EQ(corrupted(a), 0u);
  for (auto& x : a) TAGMEM_OK(tagmem_free(x.ptr, nullptr));
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
}

// Every line starts with the UTC time to the millisecond (read between the clock before and after
// the line), the pid, and the rank once the layer that knows it (an NCCL group) has set it.
TEST_F(Observe, EachLineCarriesUtcTimePidAndTheRankOnceKnown) {
  auto utc_ms = [] {
    timespec t{};
    clock_gettime(CLOCK_REALTIME, &t);
    return static_cast<long long>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
  };
  auto stamp_ms = [](const std::string& line) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(line, m, stamp_pattern())) << line;
    if (m.empty()) return -1LL;
    tm t{};
    t.tm_year = std::stoi(m[1].str()) - 1900;
    t.tm_mon = std::stoi(m[2].str()) - 1;
    t.tm_mday = std::stoi(m[3].str());
    t.tm_hour = std::stoi(m[4].str());
    t.tm_min = std::stoi(m[5].str());
    t.tm_sec = std::stoi(m[6].str());
    return static_cast<long long>(timegm(&t)) * 1000 + std::stoll(m[7].str());
  };
  auto rng = rng_for_test();
  const std::string text = "probe " + std::to_string(rng());
  const long long before = utc_ms();
  log_line(text);
  const long long after = utc_ms();
  auto lines = take();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(unstamped(lines[0]), "tagmem: " + text + "\n");
  EXPECT_LE(before, stamp_ms(lines[0])) << lines[0];
  EXPECT_LE(stamp_ms(lines[0]), after) << lines[0];

  const int rank = static_cast<int>(rng() % 4096);
  set_log_rank(rank);
  log_line(text);
  set_log_rank(-1);
  log_line(text);
  lines = take();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(unstamped(lines[0], rank), "tagmem: " + text + "\n");
  EXPECT_EQ(unstamped(lines[1]), "tagmem: " + text + "\n");

  // Before any group names the rank, the launcher's LOCAL_RANK does; one that is no number, not.
  setenv("LOCAL_RANK", std::to_string(rank + 1).c_str(), 1);
  log_line(text);
  setenv("LOCAL_RANK", "7x", 1);
  log_line(text);
  unsetenv("LOCAL_RANK");
  lines = take();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(unstamped(lines[0], rank + 1), "tagmem: " + text + "\n");
  EXPECT_EQ(unstamped(lines[1]), "tagmem: " + text + "\n");

  // The rank an NCCL pause or resume resolves (passed, or LOCAL_RANK) is the one the lines show.
  setenv("TAGMEM_JOB", "observe-test", 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  const peers::group_spec spec = peers::resolve_spec(nullptr, -1, rank + 1, 0);
  unsetenv("LOCAL_RANK");
  unsetenv("TAGMEM_JOB");
  EXPECT_EQ(spec.rank, rank);
  log_line(text);
  set_log_rank(-1);
  lines = take();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(unstamped(lines[0], rank), "tagmem: " + text + "\n");
}

}  // namespace
}  // namespace tagmem::test
