// forged_claim_test.cpp — an owner serves its buffers only to the processes it exported them to.
//
// Three processes of one job form the group: this one (rank 0) owns a buffer of random bytes
// and exports it to rank 1, a process under the shim that imports and maps it; rank 2 is
// tagmem_claim_forger (claim_forger.cpp), which speaks the group's protocol itself and forges
// what an honest shim never sends: at a pause, a claim on that buffer (after a pause and resume
// it took honestly, where it learned the buffer's id); at a resume, a request for a new handle
// of it. Either way the call fails on every rank with PEER and a message naming
// the owner's process and the forger's; the forger gets no descriptor of the buffer; and the
// refused pause releases and maps nothing anywhere (the driver calls are counted), keeps every
// byte where it was and leaks no descriptor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <sstream>

#include "nccl_way.hpp"
#include "peer.hpp"

namespace tagmem::preload_test {
namespace {

constexpr std::size_t kShared = 2u << 20;
constexpr int kTimeoutMs = 10000;

bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string pid_text(pid_t pid) { return "pid " + std::to_string(pid); }

// The driver calls that release, map or hand out memory, as this process has made them so far.
std::vector<std::uint64_t> memory_calls() {
  std::vector<std::uint64_t> n;
  for (const char* entry : {"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
                            "cuMemImportFromShareableHandle", "cuMemExportToShareableHandle"})
    n.push_back(emu_call_count(entry));
  return n;
}

// Whether a failed collective call named the forgery and both of its processes.
bool names_forgery(const std::string& m, pid_t owner, pid_t forger) {
  return mentions(m, "rank 2 (" + pid_text(forger) + ") claims buffer") &&
         mentions(m, "of rank 0 (" + pid_text(owner) + ")") &&
         mentions(m, "which was never exported to it");
}

// ---- rank 1 ----------------------------------------------------------------------------------

// Rank 1: imports the owner's buffer (fd over the control channel, with "<mode> <seed> <forger
// pid>"), says so, takes the calls of `mode` and checks its side; answers "ok" or what failed.
TAGMEM_PEER_SCENARIO(forged_claim_importer) {
  use_device(1);
  std::vector<int> fds;
  std::istringstream in(args.channel.receive(&fds));
  std::string mode;
  std::uint64_t seed = 0;
  pid_t forger = 0;
  in >> mode >> seed >> forger;
  if (fds.size() != 1) return 10;
  buffer b = import_buffer(1, fds[0], kShared);
  ::close(fds[0]);
  const std::vector<unsigned char> bytes = pattern(seed, kShared);
  std::string failed;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failed += what + "; ";
  };
  auto intact = [&] { return readable(b.va) && read_bytes(b, 0, kShared) == bytes; };
  expect(intact(), "the import does not hold the owner's bytes");
  args.channel.send("imported");
  const char* group = args.group.c_str();
  auto refused = [&](tagmem_status s, const char* call) {
    std::string m = shim().last_error();
    expect(s == TAGMEM_ERROR_PEER && names_forgery(m, ::getppid(), forger),
           std::string(call) + " was not refused naming both processes: " + std::to_string(s) +
               " " + m);
  };
  if (mode == "claim") {
    // A pause and a resume that the forger takes honestly, learning the buffer's id.
    expect(shim().pause(group, 1, 3, kTimeoutMs) == TAGMEM_SUCCESS,
           std::string("the first pause failed: ") + shim().last_error());
    expect(shim().resume(group, 1, 3, kTimeoutMs) == TAGMEM_SUCCESS,
           std::string("the first resume failed: ") + shim().last_error());
    expect(intact(), "the first pause and resume lost the owner's bytes");
    long descriptors = open_descriptors();
    std::vector<std::uint64_t> calls = memory_calls();
    tagmem_status s = shim().pause(group, 1, 3, kTimeoutMs);
    refused(s, "the pause");
    expect(shim_stats().paused == 0 && shim_stats().released_bytes == 0, "something was paused");
    expect(memory_calls() == calls, "memory was released or mapped");
    // Fewer is right: the shim closes its duplicate of the imported fd once it is matched.
    expect(open_descriptors() <= descriptors, "a descriptor leaked");
    if (s == TAGMEM_SUCCESS) shim().resume(group, 1, 3, kTimeoutMs);  // the others resume
  } else {
    expect(shim().pause(group, 1, 3, kTimeoutMs) == TAGMEM_SUCCESS, "the pause failed");
    expect(!readable(b.va), "the import was not released");
    refused(shim().resume(group, 1, 3, kTimeoutMs), "the resume");
    expect(shim().resume(group, 1, 3, kTimeoutMs) == TAGMEM_SUCCESS,
           std::string("the resume after the refusal failed: ") + shim().last_error());
    expect(shim_stats().paused == 0, "still paused");
  }
  expect(intact(), "the import lost the owner's bytes");
  free_buffer(b);
  args.channel.send(failed.empty() ? "ok" : failed);
  return 0;
}

// ---- the owner -------------------------------------------------------------------------------

// The group: rank 0 (this process) owns `mine`, rank 1 maps it, rank 2 forges.
struct forged_group {
  std::string group = unique_group("forged");
  std::uint64_t seed = std::random_device()();
  buffer mine;
  std::vector<unsigned char> bytes = pattern(seed, kShared);
  peer_process importer{"forged_claim_importer", group};
  std::unique_ptr<peer_process> forger;

  explicit forged_group(const std::string& mode) {
    use_device(0);
    mine = create_buffer(0, kShared, true);
    write_bytes(mine, 0, bytes);
    forger = peer_process::program("tagmem_claim_forger",
                                   {mode, group, "2", "3", std::to_string(kTimeoutMs)});
    int fd = export_fd(mine);
    importer.channel().send(mode + " " + std::to_string(seed) + " " + std::to_string(forger->pid()),
                            {fd});
    ::close(fd);
    importer.channel().expect("imported");
  }
  ~forged_group() { free_buffer(mine); }

  bool intact() const { return readable(mine.va) && read_bytes(mine, 0, kShared) == bytes; }

  void expect_refusal(tagmem_status s, const std::string& m) const {
    EXPECT_EQ(s, TAGMEM_ERROR_PEER) << m;
    EXPECT_TRUE(names_forgery(m, ::getpid(), forger->pid())) << m;
    // And the process it was exported to.
    EXPECT_TRUE(mentions(m, "(it went to " + pid_text(importer.pid()))) << m;
  }

  // Both other ranks report their checks passed.
  void expect_peers_done() {
    EXPECT_EQ(importer.channel().receive(), "ok");
    EXPECT_EQ(importer.wait(), 0);
    EXPECT_EQ(forger->wait(), 0) << "the forger was not refused (its stderr says how)";
  }
};

TEST(ForgedClaims, AClaimOnABufferExportedToAnotherProcessFailsThePauseEverywhere) {
  forged_group g("claim");
  // The forger learns the buffer's id at an honest pause, from the importer's claim.
  ASSERT_EQ(shim().pause(g.group.c_str(), 0, 3, kTimeoutMs), TAGMEM_SUCCESS) << shim().last_error();
  ASSERT_EQ(shim().resume(g.group.c_str(), 0, 3, kTimeoutMs), TAGMEM_SUCCESS)
      << shim().last_error();
  ASSERT_TRUE(g.intact());
  long descriptors = open_descriptors();
  std::vector<std::uint64_t> calls = memory_calls();
  tagmem_status s = shim().pause(g.group.c_str(), 0, 3, kTimeoutMs);
  std::string m = shim().last_error();
  g.expect_refusal(s, m);
  tagmem_nccl_stats st = shim_stats();
  EXPECT_EQ(st.paused, 0);
  EXPECT_EQ(st.released_bytes, 0u);
  EXPECT_EQ(st.backup_bytes, 0u);
  EXPECT_EQ(memory_calls(), calls) << "memory was released, mapped or exported";
  EXPECT_TRUE(g.intact());
  EXPECT_EQ(open_descriptors(), descriptors);
  if (s == TAGMEM_SUCCESS) shim().resume(g.group.c_str(), 0, 3, kTimeoutMs);  // the others do
  g.expect_peers_done();
}

TEST(ForgedClaims, ARequestForAHandleOfABufferExportedToAnotherProcessFailsTheResumeEverywhere) {
  forged_group g("need");
  ASSERT_EQ(shim().pause(g.group.c_str(), 0, 3, kTimeoutMs), TAGMEM_SUCCESS) << shim().last_error();
  EXPECT_FALSE(readable(g.mine.va)) << "the buffer was not released";
  long descriptors = open_descriptors();
  tagmem_status s = shim().resume(g.group.c_str(), 0, 3, kTimeoutMs);
  g.expect_refusal(s, shim().last_error());
  EXPECT_TRUE(g.intact()) << "the owner's own buffer is rebuilt whatever its importers do";
  // The rebuilt buffer's memory is one more; the fds exported for the importers are closed.
  EXPECT_EQ(open_descriptors(), descriptors + 1) << "an exported descriptor leaked";
  EXPECT_EQ(shim().resume(g.group.c_str(), 0, 3, kTimeoutMs), TAGMEM_SUCCESS)
      << shim().last_error();
  EXPECT_EQ(shim_stats().paused, 0);
  EXPECT_TRUE(g.intact());
  g.expect_peers_done();
}

}  // namespace
}  // namespace tagmem::preload_test
