// failure_test.cpp — an importer killed while it maps a range, an exporter killed while its range
// is open elsewhere, a process of another job, and handles that are forged, damaged, forgotten
// or the opener's own: each an error code and a message, never a hang, and no byte lost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "harness.hpp"
#include "ipc_harness.hpp"
#include "peer.hpp"
#include "scenarios.hpp"

namespace tagmem::ipc_test {
namespace {

using preload_test::peer_process;

constexpr std::size_t MiB = std::size_t{1} << 20;

std::uint64_t random_seed() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

class IpcFailure : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error(); }
  void TearDown() override { EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error(); }
  void* alloc_exported(std::size_t size, std::uint64_t seed, tagmem_ipc_handle* h) {
    void* p = nullptr;
    EXPECT_EQ(tagmem_malloc_tagged(&p, size, "w", 0, nullptr), TAGMEM_SUCCESS);
    write_device(p, random_bytes(seed, size));
    EXPECT_EQ(tagmem_ipc_export(p, size, h), TAGMEM_SUCCESS) << tagmem_last_error();
    return p;
  }
};

TEST_F(IpcFailure, ImporterKilledEndsItsImport) {
  const std::uint64_t seed = random_seed();
  tagmem_ipc_handle h{};
  void* p = alloc_exported(4 * MiB, seed, &h);
  peer_process peer("ipc_importer", "p");
  peer.channel().send("open " + to_text(h));
  ASSERT_EQ(peer.channel().receive(), "opened 0 " + std::to_string(4 * MiB));
  peer.channel().send("write 0 " + std::to_string(seed + 1));
  ASSERT_EQ(peer.channel().receive(), "written");
  EXPECT_EQ(ipc_stats().importers, 1u);
  peer.kill_now();
  ASSERT_TRUE(importers_become(0));  // its connection ended with it
  EXPECT_TRUE(read_device(p, 4 * MiB) == random_bytes(seed + 1, 4 * MiB));
  const char* w = "w";
  ASSERT_EQ(tagmem_offload(&w, 1, 0, TAGMEM_BACKUP), TAGMEM_SUCCESS) << tagmem_last_error();
  ASSERT_EQ(tagmem_reload(&w, 1, 0), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_TRUE(read_device(p, 4 * MiB) == random_bytes(seed + 1, 4 * MiB));
}

TEST_F(IpcFailure, ExporterKilledLeavesTheOpenRangeReadable) {
  const std::uint64_t seed = random_seed();
  peer_process exporter("ipc_exporter", "e");
  exporter.channel().send(std::to_string(seed));
  const tagmem_ipc_handle h = from_text(exporter.channel().receive());
  void* p = nullptr;
  std::size_t bytes = 0;
  int device = -1;
  ASSERT_EQ(tagmem_ipc_open(&h, &p, &bytes, &device), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(bytes, kExporterBytes);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(ipc_stats().open_here, 1u);
  exporter.kill_now();  // and reaped
  // The import holds its own reference: the pages stay, with the exporter's bytes.
  EXPECT_TRUE(read_device(p, bytes) == random_bytes(seed, bytes));
  write_device(p, random_bytes(seed + 3, bytes));
  EXPECT_TRUE(read_device(p, bytes) == random_bytes(seed + 3, bytes));
  EXPECT_EQ(tagmem_ipc_close(p), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(ipc_stats().open_here, 0u);
  // Opening it again: the exporter is gone, an error saying so.
  EXPECT_EQ(tagmem_ipc_open(&h, &p, &bytes, nullptr), TAGMEM_ERROR_PEER);
  EXPECT_NE(std::string(tagmem_last_error()).find("exports no tagged memory"), std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(handoff_test::emu_leaks(), "");
}

TEST_F(IpcFailure, ProcessOfAnotherJobIsRefused) {
  tagmem_ipc_handle h{};
  alloc_exported(2 * MiB, random_seed(), &h);
  const std::uint64_t refused = ipc_stats().refused_peers;
  peer_process peer("ipc_importer", "p", {"TAGMEM_JOB=another-job"});
  peer.channel().send("open " + to_text(h));
  const std::string answer = peer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_PEER", 0), 0u) << answer;
  EXPECT_NE(answer.find("another-job"), std::string::npos) << answer;
  EXPECT_EQ(ipc_stats().refused_peers, refused + 1);
  EXPECT_EQ(ipc_stats().importers, 0u);
  peer.channel().send("census");
  EXPECT_EQ(peer.channel().receive(), "clean");
  peer.channel().send("exit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_F(IpcFailure, ForgedDamagedForgottenAndOwnHandlesAreRefused) {
  tagmem_ipc_handle h{};
  void* p = alloc_exported(2 * MiB, random_seed(), &h);
  peer_process peer("ipc_importer", "p");

  tagmem_ipc_handle forged = h;
  forged.bytes[40] ^= 0x5a;  // the secret
  peer.channel().send("open " + to_text(forged));
  std::string answer = peer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_PEER", 0), 0u) << answer;
  EXPECT_NE(answer.find("forged"), std::string::npos) << answer;

  tagmem_ipc_handle damaged = h;
  damaged.bytes[0] ^= 0xff;  // not a tagmem handle at all
  peer.channel().send("open " + to_text(damaged));
  answer = peer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_INVALID_ARGUMENT", 0), 0u) << answer;

  void* own = nullptr;
  std::size_t bytes = 0;
  EXPECT_EQ(tagmem_ipc_open(&h, &own, &bytes, nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tagmem_ipc_open(nullptr, &own, &bytes, nullptr), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tagmem_ipc_export(p, 4 * MiB, &h), TAGMEM_ERROR_INVALID_ARGUMENT);  // past the end
  EXPECT_EQ(tagmem_ipc_export(p, 0, &h), TAGMEM_ERROR_INVALID_ARGUMENT);
  int on_stack = 0;
  EXPECT_EQ(tagmem_ipc_export(&on_stack, 4, &h), TAGMEM_ERROR_UNKNOWN_POINTER);
  EXPECT_EQ(tagmem_ipc_close(p), TAGMEM_ERROR_UNKNOWN_POINTER);

  // Unexported, then freed: both forget the export.
  ASSERT_EQ(tagmem_ipc_unexport(&h), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(tagmem_ipc_unexport(&h), TAGMEM_ERROR_UNKNOWN_POINTER);
  peer.channel().send("open " + to_text(h));
  answer = peer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_PEER", 0), 0u) << answer;
  ASSERT_EQ(tagmem_ipc_export(p, 2 * MiB, &h), TAGMEM_SUCCESS);
  ASSERT_EQ(tagmem_free(p, nullptr), TAGMEM_SUCCESS);
  peer.channel().send("open " + to_text(h));
  answer = peer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_PEER", 0), 0u) << answer;
  EXPECT_EQ(ipc_stats().importers, 0u);

  peer.channel().send("census");
  EXPECT_EQ(peer.channel().receive(), "clean");
  peer.channel().send("exit");
  EXPECT_EQ(peer.wait(), 0);
}

}  // namespace
}  // namespace tagmem::ipc_test
