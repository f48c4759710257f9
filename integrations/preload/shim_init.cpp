// shim_init.cpp — what libtagmem_preload.so does when it is loaded.
//
// Before anything else in the process can make tagmem load the driver, hand tagmem the real
// dlsym (Note [symbol resolver] in driver.cpp), so tagmem's own driver table holds the
// driver's functions and never the shim's wrappers. The real dlsym/dlvsym and the environment
// are resolved now too, rather than lazily inside somebody else's dlsym call.
#include "api/runtime.hpp"
#include "real_symbols.hpp"
#include "shim_config.hpp"

namespace {

__attribute__((constructor)) void tagmem_preload_init() {
  tagmem::preload::real_dlvsym();
  tagmem::driver::set_symbol_resolver(tagmem::preload::real_dlsym());
  tagmem::preload::config();
}

}  // namespace
