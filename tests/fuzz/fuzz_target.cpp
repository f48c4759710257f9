// fuzz_target.cpp — the libFuzzer entry points of the state-machine fuzzer.
//
// Each input is one program (state_machine.hpp). A broken expectation prints what differs and
// the operations that led there, then aborts, so libFuzzer saves the input as a crash; copy it
// into tests/fuzz/regressions/ and the replay test keeps it fixed. At exit the totals (programs,
// operations, faults, bytes verified) are printed for docs/reliability.md.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "state_machine.hpp"

namespace {

void print_totals() {
  const auto& t = tagmem::fuzz::process_totals();
  std::fprintf(stderr,
               "[tagmem fuzz] programs %llu, operations %llu, invalid calls rejected as expected "
               "%llu, injected faults fired %llu, bytes verified %llu\n",
               static_cast<unsigned long long>(t.programs),
               static_cast<unsigned long long>(t.operations),
               static_cast<unsigned long long>(t.rejected_as_expected),
               static_cast<unsigned long long>(t.faults_fired),
               static_cast<unsigned long long>(t.bytes_verified));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
#ifdef TAGMEM_EMU_LIBRARY
  setenv("TAGMEM_LIBCUDA", TAGMEM_EMU_LIBRARY, 0);
#endif
  std::string why;
  if (!tagmem::fuzz::prepare(&why)) {
    std::fprintf(stderr, "[tagmem fuzz] cannot start: %s\n", why.c_str());
    std::exit(2);
  }
  std::atexit(print_totals);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  tagmem::fuzz::program_result r = tagmem::fuzz::run_program(data, size);
  if (!r.ok) {
    std::fprintf(stderr, "[tagmem fuzz] FAILED\n%s\n", r.failure.c_str());
    std::abort();
  }
  return 0;
}
