// main.cpp — the handoff test binary: GoogleTest, or a peer scenario when started as a peer.
//
// One job and one private directory per test run (the peers inherit both), so that concurrent
// runs never meet; TAGMEM_HANDOFF=on throughout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "harness.hpp"
#include "peer.hpp"

int main(int argc, char** argv) {
  if (!std::getenv("TAGMEM_JOB")) {
    setenv("TAGMEM_JOB", ("handoff-tests-" + std::to_string(getpid())).c_str(), 0);
  }
  if (!std::getenv("TAGMEM_PEER_DIR")) {
    setenv("TAGMEM_PEER_DIR", tagmem::handoff_test::make_private_dir("handoff").c_str(), 0);
  }
  // One emulated GPU for the run's processes: they count its memory together and see one UUID.
  if (!std::getenv("TAGMEM_EMU_SHARED_DEVICES")) {
    setenv("TAGMEM_EMU_SHARED_DEVICES",
           (std::string(std::getenv("TAGMEM_PEER_DIR")) + "/emu-devices").c_str(), 0);
  }
  setenv("TAGMEM_HANDOFF", "on", 1);
  // Received memory waits for the reload, which the tests check call by call; map_ahead_test.cpp
  // turns mapping ahead on (Note [mapped ahead]) where it tests it.
  setenv("TAGMEM_HANDOFF_MAP_AHEAD", "off", 0);
  setenv("TAGMEM_HOST_SLAB_BYTES", "16MiB", 0);  // small tags: pinning 256 MiB would dominate
  if (int rc = tagmem::preload_test::run_peer_if_asked(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
