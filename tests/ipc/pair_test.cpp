// pair_test.cpp — another process maps a tagged range, reads the exporter's bytes and writes its
// own there, byte for byte; the owner cannot offload the tag while the range is open, can once it
// is closed; opening and closing many times leaves nothing behind in either process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "harness.hpp"
#include "ipc_harness.hpp"
#include "observe/log.hpp"
#include "peer.hpp"

namespace tagmem::ipc_test {
namespace {

using preload_test::peer_process;

constexpr std::size_t MiB = std::size_t{1} << 20;

class IpcPair : public ::testing::Test {
 protected:
  void SetUp() override {
    before_ = handoff_test::take_fd_census();
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    seed_ = std::random_device{}();
    seed_ = (seed_ << 32) ^ std::random_device{}();
  }
  void TearDown() override {
    EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_EQ(handoff_test::emu_leaks(), "");
    EXPECT_EQ(handoff_test::take_fd_census(), before_);
  }
  void* alloc(std::size_t size, std::uint64_t seed, const char* tag = "w") {
    void* p = nullptr;
    EXPECT_EQ(tagmem_malloc_tagged(&p, size, tag, 0, nullptr), TAGMEM_SUCCESS)
        << tagmem_last_error();
    write_device(p, random_bytes(seed, size));
    return p;
  }
  // Exports [p, p + size) and has `peer` open it as its first import.
  ::testing::AssertionResult open_in(peer_process& peer, void* p, std::size_t size) {
    tagmem_ipc_handle h{};
    if (tagmem_ipc_export(p, size, &h) != TAGMEM_SUCCESS) {
      return ::testing::AssertionFailure() << tagmem_last_error();
    }
    peer.channel().send("open " + to_text(h));
    const std::string got = peer.channel().receive();
    if (got != "opened 0 " + std::to_string(size)) return ::testing::AssertionFailure() << got;
    return ::testing::AssertionSuccess();
  }
  handoff_test::fd_census before_;
  std::uint64_t seed_ = 0;
};

TEST_F(IpcPair, PeerReadsAndWritesTheSameMemory) {
  void* a = alloc(5 * MiB, seed_);
  void* b = alloc(3 * MiB + 4096, seed_ + 1);
  // A range inside `b`, not at its start: what a tensor inside a PyTorch segment is.
  auto* inner = static_cast<unsigned char*>(b) + 8192;
  const std::size_t inner_bytes = 2 * MiB + 123;
  tagmem_ipc_handle ha{}, hb{}, again{};
  ASSERT_EQ(tagmem_ipc_export(a, 5 * MiB, &ha), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_ipc_export(inner, inner_bytes, &hb), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_ipc_export(a, 5 * MiB, &again), TAGMEM_SUCCESS);
  EXPECT_EQ(to_text(again), to_text(ha));  // the same range, the same export
  EXPECT_EQ(ipc_stats().exports, 2u);
  const std::vector<unsigned char> b_before = read_device(b, 3 * MiB + 4096);

  peer_process peer("ipc_importer", "p");
  peer.channel().send("open " + to_text(ha));
  ASSERT_EQ(peer.channel().receive(), "opened 0 " + std::to_string(5 * MiB));
  peer.channel().send("open " + to_text(hb));
  ASSERT_EQ(peer.channel().receive(), "opened 1 " + std::to_string(inner_bytes));
  peer.channel().send("check 0 " + std::to_string(seed_));
  EXPECT_EQ(peer.channel().receive(), "same");
  // The peer writes its own bytes into the inner range; the owner reads them there, and every
  // byte of `b` around it unchanged.
  peer.channel().send("write 1 " + std::to_string(seed_ + 7));
  ASSERT_EQ(peer.channel().receive(), "written");
  std::vector<unsigned char> expect = b_before;
  const std::vector<unsigned char> written = random_bytes(seed_ + 7, inner_bytes);
  std::copy(written.begin(), written.end(), expect.begin() + 8192);
  EXPECT_TRUE(read_device(b, 3 * MiB + 4096) == expect);
  EXPECT_EQ(ipc_stats().importers, 2u);

  // Offloading (or swapping out) the tag while the peer maps it is refused, naming the peer, and
  // changes nothing.
  const char* w = "w";
  EXPECT_EQ(tagmem_offload(&w, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_PEER);
  EXPECT_NE(std::string(tagmem_last_error()).find("pid " + std::to_string(peer.pid())),
            std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(tagmem_swap(&w, 1, nullptr, 0, 0, TAGMEM_DISCARD), TAGMEM_ERROR_PEER);
  EXPECT_TRUE(read_device(a, 5 * MiB) == random_bytes(seed_, 5 * MiB));

  peer.channel().send("close 0");
  ASSERT_EQ(peer.channel().receive(), "closed");
  peer.channel().send("close 1");
  ASSERT_EQ(peer.channel().receive(), "closed");
  peer.channel().send("close 1");
  EXPECT_EQ(peer.channel().receive().rfind("error TAGMEM_ERROR_UNKNOWN_POINTER", 0), 0u);
  ASSERT_TRUE(importers_become(0));

  // Closed: the offload goes ahead, and the bytes come back.
  ASSERT_EQ(tagmem_offload(&w, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_reload(&w, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_TRUE(read_device(a, 5 * MiB) == random_bytes(seed_, 5 * MiB));
  EXPECT_TRUE(read_device(b, 3 * MiB + 4096) == expect);

  // Many opens and closes leak no descriptor, mapping or range in the peer, and end every import
  // here.
  peer.channel().send("cycle " + to_text(ha) + " 300");
  EXPECT_EQ(peer.channel().receive(), "cycled");
  peer.channel().send("census");
  EXPECT_EQ(peer.channel().receive(), "clean");
  ASSERT_TRUE(importers_become(0));
  EXPECT_EQ(ipc_stats().opened_by_peers, 302u);
  peer.channel().send("exit");
  EXPECT_EQ(peer.wait(), 0);
  ASSERT_EQ(tagmem_free(a, nullptr), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_free(b, nullptr), TAGMEM_SUCCESS);
  EXPECT_EQ(ipc_stats().exports, 0u);  // freeing forgets the exports
}

// Freed while the peer maps it: no allocation of the owner lands on those pages until the peer
// closes (else the two would share bytes unknowingly); then the pool has them back.
TEST_F(IpcPair, MemoryFreedWhileOpenIsNotReusedUntilClosed) {
  constexpr std::size_t kSize = 4 * MiB;
  void* a = alloc(kSize, seed_);
  peer_process peer("ipc_importer", "p");
  ASSERT_TRUE(open_in(peer, a, kSize));

  ASSERT_EQ(tagmem_free(a, nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(tagmem_free(a, nullptr), TAGMEM_ERROR_UNKNOWN_POINTER) << "a second free passed";
  EXPECT_EQ(ipc_stats().exports, 0u);  // freeing forgets the export
  EXPECT_EQ(ipc_stats().held_allocations, 1u);
  EXPECT_EQ(ipc_stats().held_bytes, kSize);
  void* b = alloc(kSize, seed_ + 1);  // the size that would reuse a's block at once
  EXPECT_NE(b, a) << "memory the peer maps was handed out again";
  peer.channel().send("check 0 " + std::to_string(seed_));
  EXPECT_EQ(peer.channel().receive(), "same")
      << "the owner's new allocation wrote the peer's bytes";
  peer.channel().send("write 0 " + std::to_string(seed_ + 2));
  ASSERT_EQ(peer.channel().receive(), "written");
  EXPECT_TRUE(read_device(b, kSize) == random_bytes(seed_ + 1, kSize))
      << "the peer's writes reached the owner's new allocation";
  ASSERT_EQ(tagmem_empty_cache(0), TAGMEM_SUCCESS) << tagmem_last_error();
  peer.channel().send("check 0 " + std::to_string(seed_ + 2));
  EXPECT_EQ(peer.channel().receive(), "same");

  peer.channel().send("close 0");
  ASSERT_EQ(peer.channel().receive(), "closed");
  ASSERT_TRUE(importers_become(0));
  // Given back to the pool on the IPC thread once the import has ended: the best fit for its size
  // again (nothing else of that size is cached).
  bool back = false;
  for (int i = 0; i < 1000 && !back; ++i) {
    void* c = nullptr;
    ASSERT_EQ(tagmem_malloc_tagged(&c, kSize, "w", 0, nullptr), TAGMEM_SUCCESS);
    back = c == a;
    ASSERT_EQ(tagmem_free(c, nullptr), TAGMEM_SUCCESS);
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(back) << "the freed allocation stayed out of the pool after the peer closed";
  EXPECT_EQ(ipc_stats().held_allocations, 0u);
  EXPECT_EQ(ipc_stats().held_bytes, 0u);
  peer.channel().send("exit");
  EXPECT_EQ(peer.wait(), 0);
  ASSERT_EQ(tagmem_free(b, nullptr), TAGMEM_SUCCESS);
}

// A hold has no time limit, so the log says who keeps a freed allocation out of the pool, and for
// how long once it is back.
TEST_F(IpcPair, AFreeHeldByAnImportIsLoggedWithTheImportersPid) {
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS);
  setenv("TAGMEM_LOG", "info", 1);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
  std::mutex mutex;
  std::vector<std::string> lines;
  set_log_sink_for_testing([&](const std::string& l) {
    std::lock_guard lock(mutex);
    // "tagmem: <time> pid=<pid> ipc held-...\n": the event and its keys
    const std::size_t at = l.find(" ipc held-");
    if (at != std::string::npos) lines.push_back(l.substr(at + 1, l.size() - at - 2));
  });
  struct quiet_again {
    ~quiet_again() {
      set_log_sink_for_testing({});
      unsetenv("TAGMEM_LOG");
    }
  } quiet;
  const auto held_lines = [&] {
    std::lock_guard lock(mutex);
    return lines;
  };
  constexpr std::size_t kSize = 4 * MiB;
  void* a = alloc(kSize, seed_);
  peer_process peer("ipc_importer", "p");
  ASSERT_TRUE(open_in(peer, a, kSize));
  ASSERT_EQ(tagmem_free(a, nullptr), TAGMEM_SUCCESS) << tagmem_last_error();

  const std::string address = format_address(reinterpret_cast<std::uintptr_t>(a));
  ASSERT_EQ(held_lines().size(), 1u);
  EXPECT_EQ(held_lines()[0], "ipc held-after-free tag=w ptr=" + address + " bytes=" +
                                 std::to_string(kSize) + " by_pids=" + std::to_string(peer.pid()));
  peer.channel().send("close 0");
  ASSERT_EQ(peer.channel().receive(), "closed");
  ASSERT_TRUE(importers_become(0));
  for (int i = 0; i < 1000 && held_lines().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(held_lines().size(), 2u);
  const std::string returned =
      "ipc held-returned ptr=" + address + " bytes=" + std::to_string(kSize) + " held_ms=";
  EXPECT_EQ(held_lines()[1].rfind(returned, 0), 0u) << held_lines()[1];
  EXPECT_GT(std::stod(held_lines()[1].substr(returned.size())), 0.0) << held_lines()[1];
  EXPECT_EQ(ipc_stats().held_allocations, 0u);
  peer.channel().send("exit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_F(IpcPair, OpenWhileOffloadedIsRefusedAndWorksAfterReload) {
  void* a = alloc(4 * MiB, seed_);
  tagmem_ipc_handle h{};
  ASSERT_EQ(tagmem_ipc_export(a, 4 * MiB, &h), TAGMEM_SUCCESS) << tagmem_last_error();
  const char* w = "w";
  // An export nobody maps does not hold its tag.
  ASSERT_EQ(tagmem_offload(&w, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  peer_process peer("ipc_importer", "p");
  peer.channel().send("open " + to_text(h));
  const std::string refused = peer.channel().receive();
  EXPECT_EQ(refused.rfind("error TAGMEM_ERROR_TAG_OFFLOADED", 0), 0u) << refused;
  EXPECT_NE(refused.find("offloaded"), std::string::npos) << refused;
  ASSERT_EQ(tagmem_reload(&w, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  peer.channel().send("open " + to_text(h));
  ASSERT_EQ(peer.channel().receive(), "opened 0 " + std::to_string(4 * MiB));
  peer.channel().send("check 0 " + std::to_string(seed_));
  EXPECT_EQ(peer.channel().receive(), "same");
  peer.channel().send("close 0");
  ASSERT_EQ(peer.channel().receive(), "closed");
  peer.channel().send("census");
  EXPECT_EQ(peer.channel().receive(), "clean");
  peer.channel().send("exit");
  EXPECT_EQ(peer.wait(), 0);
  ASSERT_TRUE(importers_become(0));
}

}  // namespace
}  // namespace tagmem::ipc_test
