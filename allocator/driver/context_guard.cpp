// context_guard.cpp — see context_guard.hpp.
#include "driver/context_guard.hpp"

#include "driver/driver.hpp"

namespace tagmem {

context_guard::context_guard(CUcontext ctx) {
  TAGMEM_CU(cuCtxGetCurrent, &previous_);
  if (previous_ != ctx) {
    TAGMEM_CU(cuCtxSetCurrent, ctx);
    switched_ = true;
  }
}

context_guard::~context_guard() {
  if (switched_) driver::api().cuCtxSetCurrent(previous_);
}

}  // namespace tagmem
