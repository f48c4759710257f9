// no_job_test.cpp — tagged-memory IPC between processes that have no job identity (a plain
// `python train.py` and its torch.multiprocessing children): it works, the secret still
// authorises, and a job where both sides have one still separates (Note [ipc without a job] in
// allocator/registry/registry_ipc.cpp). Another uid cannot be tested as one user; the uid check
// is unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ipc_harness.hpp"
#include "peer.hpp"
#include "scenarios.hpp"

namespace tagmem::ipc_test {
namespace {

using preload_test::peer_process;

// Every variable a job identity is read from, removed from the peer's environment.
const std::vector<std::string> kNoJob = {"TAGMEM_JOB", "TAGMEM_NCCL_JOB", "TORCHELASTIC_RUN_ID",
                                         "SLURM_JOB_ID"};

std::vector<std::string> no_job_and(const std::string& setting) {
  std::vector<std::string> s = kNoJob;
  s.erase(std::remove(s.begin(), s.end(), setting.substr(0, setting.find('='))), s.end());
  s.push_back(setting);
  return s;
}

std::uint64_t random_seed() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

// An exporter peer with the given environment; its handle.
tagmem_ipc_handle start_exporter(peer_process& exporter, std::uint64_t seed) {
  exporter.channel().send(std::to_string(seed));
  return from_text(exporter.channel().receive());
}

// Opens `h` in `importer` as its first range and checks its bytes against `seed`.
void open_and_check(peer_process& importer, const tagmem_ipc_handle& h, std::uint64_t seed) {
  importer.channel().send("open " + to_text(h));
  ASSERT_EQ(importer.channel().receive(), "opened 0 " + std::to_string(kExporterBytes));
  importer.channel().send("check 0 " + std::to_string(seed));
  EXPECT_EQ(importer.channel().receive(), "same");
}

TEST(IpcWithoutJob, NeitherProcessHasAJob) {
  const std::uint64_t seed = random_seed();
  peer_process exporter("ipc_exporter", "x", kNoJob);
  const tagmem_ipc_handle h = start_exporter(exporter, seed);
  peer_process importer("ipc_importer", "p", kNoJob);
  open_and_check(importer, h, seed);
  if (::testing::Test::HasFatalFailure()) return;
  importer.channel().send("write 0 " + std::to_string(seed + 1));
  ASSERT_EQ(importer.channel().receive(), "written");
  exporter.channel().send("check " + std::to_string(seed + 1));
  EXPECT_EQ(exporter.channel().receive(), "same");
  importer.channel().send("close 0");
  EXPECT_EQ(importer.channel().receive(), "closed");
  importer.channel().send("census");
  EXPECT_EQ(importer.channel().receive(), "clean");
  importer.channel().send("exit");
  exporter.channel().send("exit");
  EXPECT_EQ(importer.wait(), 0);
  EXPECT_EQ(exporter.wait(), 0);
}

TEST(IpcWithoutJob, ForgedSecretIsRefused) {
  peer_process exporter("ipc_exporter", "x", kNoJob);
  tagmem_ipc_handle h = start_exporter(exporter, random_seed());
  h.bytes[40] ^= 0x5a;  // the secret
  peer_process importer("ipc_importer", "p", kNoJob);
  importer.channel().send("open " + to_text(h));
  const std::string answer = importer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_PEER", 0), 0u) << answer;
  EXPECT_NE(answer.find("with that secret"), std::string::npos) << answer;
  importer.channel().send("census");
  EXPECT_EQ(importer.channel().receive(), "clean");
  importer.channel().send("exit");
  exporter.channel().send("exit");
}

TEST(IpcWithoutJob, OpenerWithoutAJobMayOpenAJobsExport) {
  const std::uint64_t seed = random_seed();
  peer_process exporter("ipc_exporter", "x", no_job_and("TAGMEM_JOB=exporting-job"));
  const tagmem_ipc_handle h = start_exporter(exporter, seed);
  peer_process importer("ipc_importer", "p", kNoJob);
  open_and_check(importer, h, seed);
  if (::testing::Test::HasFatalFailure()) return;
  importer.channel().send("exit");
  exporter.channel().send("exit");
}

TEST(IpcWithoutJob, ADifferentJobIsStillRefused) {
  peer_process exporter("ipc_exporter", "x", no_job_and("TAGMEM_JOB=exporting-job"));
  const tagmem_ipc_handle h = start_exporter(exporter, random_seed());
  peer_process importer("ipc_importer", "p", no_job_and("TORCHELASTIC_RUN_ID=other-run"));
  importer.channel().send("open " + to_text(h));
  const std::string answer = importer.channel().receive();
  EXPECT_EQ(answer.rfind("error TAGMEM_ERROR_PEER", 0), 0u) << answer;
  EXPECT_NE(answer.find("torchrun:other-run"), std::string::npos) << answer;
  importer.channel().send("exit");
  exporter.channel().send("exit");
}

}  // namespace
}  // namespace tagmem::ipc_test
