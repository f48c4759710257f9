// errors.cpp — cuGetErrorName and cuGetErrorString.
//
// One row per code: every code the emulator returns, and the common ones a caller may pass in
// from elsewhere, with the real driver's wording. An unknown code is CUDA_ERROR_INVALID_VALUE
// with a null string, as on the real driver (measured). Both work before cuInit.
#include <cstring>

#include "api.hpp"

namespace {

struct error_text {
  CUresult code;
  const char* name;
  const char* text;
};

#define TAGMEM_EMU_ERROR(code, text) \
  { code, #code, text }

constexpr error_text errors[] = {
    TAGMEM_EMU_ERROR(CUDA_SUCCESS, "no error"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access is not enabled"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                     "part or all of the requested memory range is already mapped"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                     "pointer does not correspond to a registered memory region"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_ILLEGAL_STATE,
                     "the operation cannot be performed in the present state"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "operation not permitted when stream is capturing"),
    TAGMEM_EMU_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

#undef TAGMEM_EMU_ERROR

// Callers may pass any integer as a CUresult (the real driver answers unknown codes with an
// error), so the value is read as an int: loading an out-of-range enum is undefined behaviour.
const error_text* find(const CUresult& code) {
  int raw = 0;
  std::memcpy(&raw, &code, sizeof raw);
  for (const error_text& e : errors)
    if (static_cast<int>(e.code) == raw) return &e;
  return nullptr;
}

}  // namespace

TAGMEM_EMU_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  TAGMEM_EMU_ENTRY_ANY_TIME(cuGetErrorName);
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const error_text* e = find(error);
  *name = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

TAGMEM_EMU_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  TAGMEM_EMU_ENTRY_ANY_TIME(cuGetErrorString);
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const error_text* e = find(error);
  *text = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
