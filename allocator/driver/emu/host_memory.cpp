// host_memory.cpp — cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister, cuMemHostUnregister,
// cuMemHostGetFlags.
//
// Ranges are kept in one ordered map by base address, each marked as allocated here or
// registered. The answers follow the real driver as measured on an H200: overlapping an
// existing registration is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, registering memory from
// cuMemHostAlloc or memory that is not mapped is CUDA_ERROR_INVALID_VALUE, unregistering an
// address inside a registration is CUDA_ERROR_INVALID_VALUE and one outside every registration
// CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED. Freeing or unregistering first waits for every stream,
// as the real calls do, so no queued copy can touch memory given back. cuMemHostGetFlags answers
// for any address inside a range of either kind, with the flags it was made with, and
// CUDA_ERROR_INVALID_VALUE elsewhere (the real driver answers for registered memory too:
// torch_memory_saver's callers ask it whether a host copy is still pinned).
#include "host_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <vector>

#include "api.hpp"
#include "contexts.hpp"
#include "streams.hpp"

namespace tagmem::emu {
namespace {

struct host_range {
  size_t size = 0;         // bytes the caller asked for
  size_t mapped = 0;       // bytes mapped here (allocations only)
  bool allocated = false;  // cuMemHostAlloc, else cuMemHostRegister
  unsigned flags = 0;      // as given to either
};

std::map<uintptr_t, host_range>& ranges() {
  static auto* instance = new std::map<uintptr_t, host_range>;  // leaked
  return *instance;
}

// The range containing `addr`, or end().
auto containing(uintptr_t addr) {
  auto it = ranges().upper_bound(addr);
  if (it == ranges().begin()) return ranges().end();
  --it;
  return addr < it->first + it->second.size ? it : ranges().end();
}

// The first range overlapping [addr, addr+size), or end().
auto overlapping(uintptr_t addr, size_t size) {
  if (auto it = containing(addr); it != ranges().end()) return it;
  auto it = ranges().lower_bound(addr);
  return it != ranges().end() && it->first < addr + size ? it : ranges().end();
}

// Whether every page of [addr, addr+size) is mapped in this process.
bool mapped(uintptr_t addr, size_t size) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = addr / page * page;
  const size_t span = round_up(addr + size, page) - start;
  std::vector<unsigned char> residency(span / page);
  return ::mincore(reinterpret_cast<void*>(start), span, residency.data()) == 0;
}

// The calling thread's context must be usable (Note [emu sticky errors]).
CUresult check_current() {
  lock held = take_lock();
  int device = 0;
  return current_device(held, &device);
}

}  // namespace

bool is_pinned(lock&, uintptr_t addr, size_t size) {
  auto it = containing(addr);
  return it != ranges().end() && addr + size <= it->first + it->second.size;
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  TAGMEM_EMU_ENTRY(cuMemHostAlloc);
  constexpr unsigned known =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || (flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_current(); r != CUDA_SUCCESS) return r;
  if (bytesize == 0) {  // succeeds with a null pointer, as measured
    *pp = nullptr;
    return CUDA_SUCCESS;
  }
  const size_t mapped_bytes = round_up(bytesize, static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  void* at =
      ::mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  lock held = take_lock();
  ranges()[reinterpret_cast<uintptr_t>(at)] = host_range{bytesize, mapped_bytes, true, flags};
  ++live(held).host_allocations;
  live(held).pinned_bytes += bytesize;
  *pp = at;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemFreeHost(void* p) {
  TAGMEM_EMU_ENTRY(cuMemFreeHost);
  if (p == nullptr) return CUDA_SUCCESS;
  if (CUresult r = check_current(); r != CUDA_SUCCESS) return r;
  const auto base = reinterpret_cast<uintptr_t>(p);
  {
    lock held = take_lock();
    auto it = ranges().find(base);
    if (it == ranges().end() || !it->second.allocated) return CUDA_ERROR_INVALID_VALUE;
  }
  synchronize_all_devices();
  lock held = take_lock();
  auto it = ranges().find(base);
  if (it == ranges().end() || !it->second.allocated) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(p, it->second.mapped);
  --live(held).host_allocations;
  live(held).pinned_bytes -= it->second.size;
  ranges().erase(it);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int flags) {
  TAGMEM_EMU_ENTRY(cuMemHostRegister);
  constexpr unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                             CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (p == nullptr || bytesize == 0 || (flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  const auto base = reinterpret_cast<uintptr_t>(p);
  if (base + bytesize < base) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_current(); r != CUDA_SUCCESS) return r;
  lock held = take_lock();
  if (auto it = overlapping(base, bytesize); it != ranges().end())
    return it->second.allocated ? CUDA_ERROR_INVALID_VALUE
                                : CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (!mapped(base, bytesize)) return CUDA_ERROR_INVALID_VALUE;
  ranges()[base] = host_range{bytesize, 0, false, flags};
  ++live(held).host_registrations;
  live(held).pinned_bytes += bytesize;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemHostUnregister(void* p) {
  TAGMEM_EMU_ENTRY(cuMemHostUnregister);
  const auto base = reinterpret_cast<uintptr_t>(p);
  auto check = [&](lock&) {
    auto it = containing(base);
    if (it == ranges().end() || it->second.allocated) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return it->first == base ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  if (CUresult r = check_current(); r != CUDA_SUCCESS) return r;
  {
    lock held = take_lock();
    if (CUresult r = check(held); r != CUDA_SUCCESS) return r;
  }
  synchronize_all_devices();
  lock held = take_lock();
  if (CUresult r = check(held); r != CUDA_SUCCESS) return r;
  auto it = ranges().find(base);
  --live(held).host_registrations;
  live(held).pinned_bytes -= it->second.size;
  ranges().erase(it);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  TAGMEM_EMU_ENTRY(cuMemHostGetFlags);
  if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_current(); r != CUDA_SUCCESS) return r;
  lock held = take_lock();
  auto it = containing(reinterpret_cast<uintptr_t>(p));
  if (it == ranges().end()) return CUDA_ERROR_INVALID_VALUE;
  *pFlags = it->second.flags;
  return CUDA_SUCCESS;
}
