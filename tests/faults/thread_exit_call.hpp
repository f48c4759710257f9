// thread_exit_call.hpp — tagmem_free called from a thread's exit, for the fault sweep and the
// state-machine fuzzer.
//
// Thread pools free device memory in thread-local destructors (CUDA libraries, NCCL proxies,
// Python thread states). The free runs from a pthread key destructor of a new thread, which
// runs after the thread's C++ thread_local destructors: with `use_first`, the thread has called
// tagmem (a tag scope) during its life, so its metadata heap was live and has just been torn
// down; without, the free is the thread's first call.
#pragma once

#include <string>

#include "tagmem/tagmem.h"

namespace tagmem::reliability {

// tagmem_free(ptr, stream) at the exit of a new thread, joined before returning; with
// `use_first` the thread pushes and pops `scope_tag` first (on its current device, device 0: a
// new name creates the tag there). The status of the first call that failed, with its message in
// `message`.
tagmem_status free_at_thread_exit(void* ptr, tagmem_stream stream, bool use_first,
                                  std::string& message, const char* scope_tag = "exit-scope");

}  // namespace tagmem::reliability
