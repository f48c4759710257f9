// memops.cpp — cuStreamWaitValue32: a stream waits until a 32-bit word in memory passes a test.
//
// The wait is queued like cuStreamWaitEvent (on the NULL stream it does not block the caller);
// when the stream reaches it, its worker reads the word every 20 µs until the test passes, as a
// GPU's front end polls it. Whoever writes the word (a thread of this process, here) decides when
// the stream goes on. A word that never passes holds the stream forever, on the real driver too.
// Simplification: the word must lie in pinned host memory (cuMemHostAlloc, cuMemHostRegister),
// the one kind tagmem waits on; a device address is CUDA_ERROR_INVALID_VALUE here, though the
// real driver accepts one. CU_STREAM_WAIT_VALUE_FLUSH, which needs platform support, is refused
// as on a machine without it.
#include <atomic>
#include <chrono>
#include <thread>

#include "api.hpp"
#include "contexts.hpp"
#include "host_memory.hpp"
#include "streams.hpp"

namespace tagmem::emu {
namespace {

bool passes(uint32_t word, uint32_t value, unsigned test) {
  switch (test) {
    case CU_STREAM_WAIT_VALUE_GEQ:  // cyclic, as the driver documents: (int32_t)(word - value) >= 0
      return static_cast<int32_t>(word - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return word == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (word & value) != 0;
    default:  // CU_STREAM_WAIT_VALUE_NOR
      return ~(word | value) != 0;
  }
}

}  // namespace
}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuStreamWaitValue32(CUstream stream_handle, CUdeviceptr addr,
                                               cuuint32_t value, unsigned int flags) {
  TAGMEM_EMU_ENTRY(cuStreamWaitValue32);
  const unsigned test = flags & 0x3u;
  if ((flags & ~0x3u) != 0 || addr % sizeof(uint32_t) != 0) return CUDA_ERROR_INVALID_VALUE;
  target where;
  {
    lock held = take_lock();
    if (CUresult r = resolve_stream(held, stream_handle, &where); r != CUDA_SUCCESS) return r;
    if (!is_pinned(held, static_cast<uintptr_t>(addr), sizeof(uint32_t)))
      return CUDA_ERROR_INVALID_VALUE;
  }
  auto* word = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(addr));
  const int device = where.device;
  submit_wait(where, [word, value, test, device]() -> CUresult {
    std::atomic_ref<uint32_t> seen(*word);
    while (!passes(seen.load(std::memory_order_acquire), value, test)) {
      if (sticky_error(device) != CUDA_SUCCESS) return CUDA_SUCCESS;  // a dead context waits not
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return CUDA_SUCCESS;
  });
  return CUDA_SUCCESS;
}
