// proc_address.cpp — cuGetProcAddress_v2 and the legacy four-argument cuGetProcAddress.
//
// The table is built from entry_points.def, the same list tagmem's loader asks for, so the two
// can never disagree: base name → the function cuda.h declares for it at this toolkit's
// CUDA_VERSION (&::cuMemcpyHtoDAsync is cuMemcpyHtoDAsync_v2). "cuGetProcAddress" itself is in
// it too, answered with cuGetProcAddress_v2, because the CUDA runtime looks itself up and calls
// through that pointer from then on.
//
// Answers follow the real driver (measured, driver 580): an unknown name is CUDA_SUCCESS with a
// null function and status CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND from the v2 entry point, but
// CUDA_ERROR_NOT_FOUND from the legacy one; a version below every entry's introduction is
// CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT; unknown flags are CUDA_ERROR_INVALID_VALUE.
// Simplifications: older ABI versions of an entry (cuMemcpyHtoDAsync before _v2) and the
// per-thread-default-stream variants (_ptsz) are the same functions as the current ones.
// These work before cuInit and are neither counted nor open to fault injection.
#include <cstring>

#include "api.hpp"

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the legacy symbol needs its own name.
#undef cuGetProcAddress
TAGMEM_EMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                            cuuint64_t flags);

namespace {

struct proc {
  const char* name;
  void* function;
};

const proc procs[] = {
#define TAGMEM_DRIVER_ENTRY(name) {#name, reinterpret_cast<void*>(&::name)},
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
    {"cuGetProcAddress", reinterpret_cast<void*>(&::cuGetProcAddress_v2)},
};

constexpr int oldest_version = 2000;  // no entry point here is older than CUDA 2.0

void* find(const char* name) {
  for (const proc& p : procs)
    if (std::strcmp(p.name, name) == 0) return p.function;
  return nullptr;
}

constexpr cuuint64_t known_flags =
    CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

}  // namespace

TAGMEM_EMU_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                               cuuint64_t flags,
                                               CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr || (flags & ~known_flags) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  void* function = find(symbol);
  CUdriverProcAddressQueryResult result = CU_GET_PROC_ADDRESS_SUCCESS;
  if (function == nullptr) {
    result = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  } else if (cuda_version < oldest_version) {
    result = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    function = nullptr;
  }
  *pfn = function;
  if (status != nullptr) *status = result;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                            cuuint64_t flags) {
  if (symbol == nullptr || pfn == nullptr || (flags & ~known_flags) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  void* function = find(symbol);
  if (function == nullptr || cuda_version < oldest_version) return CUDA_ERROR_NOT_FOUND;
  *pfn = function;
  return CUDA_SUCCESS;
}
