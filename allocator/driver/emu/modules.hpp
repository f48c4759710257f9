// modules.hpp — loaded modules and the one function tagmem launches (see modules.cpp).
#pragma once

#include <cuda.h>

#include "state.hpp"

namespace tagmem::emu {

// Whether `f` is the host-to-device copy kernel of a module that is still loaded.
bool is_copy_kernel(lock&, CUfunction f);

}  // namespace tagmem::emu
