// oom_message.hpp — out-of-memory errors that say what the user needs to decide what to do.
//
// The driver's own words ("cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY") name neither the tag
// nor the sizes. At the C ABI, an OUT_OF_MEMORY from an allocation, reload or swap is thrown again
// with a message naming the tag, the bytes it asked for, the free device memory, the largest
// resident tags (what could be offloaded to make room) and, for a reload, that the tag stays
// offloaded with its backup (the engine's contract, offload_engine.hpp). With TAGMEM_LOG=info the
// message is logged too.
#pragma once

#include <cstddef>
#include <string>

#include "base/error.hpp"
#include "registry/registry.hpp"

namespace tagmem {

// The message for an OUT_OF_MEMORY `e` of `what` ("reload of", "allocation in") on the tags
// `names` of device `device`; `asked` is the bytes requested (0: each offloaded tag's size).
// Takes the tags' locks; the failed operation must hold none of them.
std::string explain_out_of_memory_message(registry& r, int device, const char* what,
                                          const char* const* names, std::size_t count,
                                          std::size_t asked, const error& e);

// Runs `body`; an OUT_OF_MEMORY it throws is thrown again, explained.
template <class F>
void explain_out_of_memory(registry& r, int device, const char* what, const char* const* names,
                           std::size_t count, std::size_t asked, F&& body) {
  try {
    body();
  } catch (const error& e) {
    if (e.code() != TAGMEM_ERROR_OUT_OF_MEMORY) throw;
    throw error(TAGMEM_ERROR_OUT_OF_MEMORY,
                explain_out_of_memory_message(r, device, what, names, count, asked, e));
  }
}

}  // namespace tagmem
