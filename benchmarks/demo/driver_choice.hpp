// driver_choice.hpp — which CUDA driver the demo runs on.
//
// The library never falls back to the emulator; the demo does, and says so: if TAGMEM_LIBCUDA is
// set it is used as given; otherwise, if libcuda.so.1 loads and reports a device, the real driver
// is used; otherwise TAGMEM_LIBCUDA is pointed at the emulated driver built beside the demo.
#pragma once

#include <string>

namespace tagmem::demo {

struct driver_choice {
  bool emulated = false;
  std::string library;  // what TAGMEM_LIBCUDA names, or "libcuda.so.1"
  std::string why;      // one line for the first line of output
};

// Decides, and sets TAGMEM_LIBCUDA when falling back to the emulator.
driver_choice choose_driver(const char* argv0);

}  // namespace tagmem::demo
