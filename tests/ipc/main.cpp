// main.cpp — the IPC test binary: GoogleTest, or a peer scenario when started as a peer.
//
// One job and one private directory per test run (the peers inherit both, and one emulated GPU),
// so that concurrent runs never meet.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "harness.hpp"
#include "peer.hpp"

int main(int argc, char** argv) {
  if (!std::getenv("TAGMEM_PEER_DIR")) {
    setenv("TAGMEM_PEER_DIR", tagmem::handoff_test::make_private_dir("ipc").c_str(), 0);
  }
  if (!std::getenv("TAGMEM_EMU_SHARED_DEVICES")) {
    setenv("TAGMEM_EMU_SHARED_DEVICES",
           (std::string(std::getenv("TAGMEM_PEER_DIR")) + "/emu-devices").c_str(), 0);
  }
  setenv("TAGMEM_HOST_SLAB_BYTES", "16MiB", 0);  // small tags: pinning 256 MiB would dominate
  // Peers inherit the job, or run without one where a test removed it (no_job_test.cpp).
  bool peer = false;
  for (int i = 1; i < argc; ++i) peer |= std::string(argv[i]).rfind("--peer=", 0) == 0;
  if (!peer && !std::getenv("TAGMEM_JOB")) {
    setenv("TAGMEM_JOB", ("ipc-tests-" + std::to_string(getpid())).c_str(), 0);
  }
  if (int rc = tagmem::preload_test::run_peer_if_asked(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
