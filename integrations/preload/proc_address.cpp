// proc_address.cpp — the wrapped cuGetProcAddress (see header).
//
// Note [self lookup]: the CUDA runtime asks cuGetProcAddress for "cuGetProcAddress" itself and
// calls through the answer from then on (as observed with the real runtime). If that answer
// were the driver's own function, every later lookup would bypass the shim. So a lookup of
// "cuGetProcAddress" through a wrapped cuGetProcAddress answers with the wrapper again: the v2
// wrapper (five arguments) for versions >= 12000, where the driver hands out
// cuGetProcAddress_v2, the four-argument one below.
#include "proc_address.hpp"

#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "driver_wrappers.hpp"
#include "reentry_guard.hpp"
#include "shim_config.hpp"

namespace tagmem::preload {
namespace {

using gpa2_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using gpa1_fn = CUresult (*)(const char*, void**, int, cuuint64_t);

std::atomic<gpa2_fn> g_real_gpa2{nullptr};
std::atomic<gpa1_fn> g_real_gpa1{nullptr};

template <class F>
void capture_first(std::atomic<F>& slot, void* fn) {
  F expected = nullptr;
  slot.compare_exchange_strong(expected, reinterpret_cast<F>(fn));
}

CUresult wrapped_gpa2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status);
CUresult wrapped_gpa1(const char* symbol, void** pfn, int version, cuuint64_t flags);

// The answer for `symbol` at `version`, where the driver answered `fn`.
void* wrap_proc(const char* symbol, int version, void* fn) {
  if (!symbol || !fn || reentry_guard::inside()) return fn;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {  // Note [self lookup]
    if (version >= 12000) {
      capture_first(g_real_gpa2, fn);
      return reinterpret_cast<void*>(&wrapped_gpa2);
    }
    capture_first(g_real_gpa1, fn);
    return reinterpret_cast<void*>(&wrapped_gpa1);
  }
  const wrapped_entry* e = find_proc_entry(symbol);
  if (!e || version < e->min_version) return fn;
  e->capture(fn);
  if (config().log)
    std::fprintf(stderr, "[tagmem preload] wrapped %s (version %d)\n", symbol, version);
  return e->wrapper;
}

CUresult wrapped_gpa2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) {
  gpa2_fn real = g_real_gpa2.load();
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn) *pfn = wrap_proc(symbol, version, *pfn);
  return r;
}

CUresult wrapped_gpa1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  CUresult r;
  if (gpa1_fn real = g_real_gpa1.load()) {
    r = real(symbol, pfn, version, flags);
  } else if (gpa2_fn real2 = g_real_gpa2.load()) {
    r = real2(symbol, pfn, version, flags, nullptr);
    if (r == CUDA_SUCCESS && pfn && !*pfn) r = CUDA_ERROR_NOT_FOUND;  // the v1 answer
  } else {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (r == CUDA_SUCCESS && pfn) *pfn = wrap_proc(symbol, version, *pfn);
  return r;
}

}  // namespace

bool driver_symbol_of_interest(const char* name) noexcept {
  if (!name || name[0] != 'c' || name[1] != 'u') return false;
  return same_string(name, "cuGetProcAddress_v2") || same_string(name, "cuGetProcAddress") ||
         find_exported_entry(name) != nullptr;
}

void* wrap_dlsym_result(const char* name, void* real, const void* caller) {
  if (!real || !records_driver_calls_of(caller)) return real;
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    capture_first(g_real_gpa2, real);
    return reinterpret_cast<void*>(&wrapped_gpa2);
  }
  if (std::strcmp(name, "cuGetProcAddress") == 0) {  // libcuda's exported v1 symbol
    capture_first(g_real_gpa1, real);
    return reinterpret_cast<void*>(&wrapped_gpa1);
  }
  const wrapped_entry* e = find_exported_entry(name);
  if (!e) return real;
  e->capture(real);
  return e->wrapper;
}

}  // namespace tagmem::preload
