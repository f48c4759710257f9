// main.cpp — the preload test binary: GoogleTest, or a peer scenario when started as rank 1.
//
// The binary must run under LD_PRELOAD=libtagmem_preload.so with TAGMEM_LIBCUDA naming the
// emulated driver (ctest sets both); it refuses to run otherwise rather than skip.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "peer.hpp"

int main(int argc, char** argv) {
  // One job per test run (the peers inherit it), so that concurrent runs never meet.
  if (!std::getenv("TAGMEM_NCCL_JOB"))
    setenv("TAGMEM_NCCL_JOB", ("preload-tests-" + std::to_string(getpid())).c_str(), 0);
  if (int rc = tagmem::preload_test::run_peer_if_asked(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  if (!dlsym(RTLD_DEFAULT, "tagmem_nccl_pause")) {
    std::fprintf(stderr, "these tests must run under LD_PRELOAD=libtagmem_preload.so\n");
    return 2;
  }
  return RUN_ALL_TESTS();
}
