// devices.cpp — cuInit, the driver version, device enumeration and attributes, and the control
// functions that size devices.
//
// Attributes answer what tagmem and the CUDA runtime ask about an H200-class device that
// supports virtual memory management: VMM, POSIX-fd handles, memory pools and unified
// addressing are supported, compute capability 9.0; every other valid attribute reads 0.
#include <cstdlib>
#include <cstring>
#include <string>

#include "api.hpp"
#include "contexts.hpp"
#include "emu_control.h"
#include "option_table.hpp"

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuInit(unsigned int flags) {
  TAGMEM_EMU_ENTRY_ANY_TIME(cuInit);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (device_count() == 0) return CUDA_ERROR_NO_DEVICE;
  mark_initialized();
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuDriverGetVersion(int* version) {
  TAGMEM_EMU_ENTRY_ANY_TIME(cuDriverGetVersion);
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  TAGMEM_EMU_ENTRY(cuDeviceGet);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuDeviceGetCount(int* count) {
  TAGMEM_EMU_ENTRY(cuDeviceGetCount);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = device_count();
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute,
                                                CUdevice device) {
  TAGMEM_EMU_ENTRY(cuDeviceGetAttribute);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = 132;  // as an H200
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = 9;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

// A device's UUID: a hash of the ordinal and of TAGMEM_EMU_SHARED_DEVICES (the file through which
// emulated processes share device memory; "emu" when unset). Processes that share the file see one
// GPU per ordinal, as processes of one machine do; a process naming another file is on other GPUs.
// (cuda.h maps the name to cuDeviceGetUuid_v2, the same prototype.)
TAGMEM_EMU_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  TAGMEM_EMU_ENTRY(cuDeviceGetUuid);
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  const char* shared = std::getenv(tagmem::spec_of(tagmem::option::EMU_SHARED_DEVICES).name);
  const std::string seed =
      std::string(shared && *shared ? shared : "emu") + "#" + std::to_string(device);
  uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};  // two FNV-1a lanes
  for (unsigned char c : seed) {
    h[0] = (h[0] ^ c) * 0x100000001b3ull;
    h[1] = (h[1] ^ (c + 1u)) * 0x100000001b3ull;
  }
  std::memcpy(uuid->bytes, h, sizeof uuid->bytes);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT int tagmem_emu_device_count(void) { return device_count(); }

TAGMEM_EMU_EXPORT int tagmem_emu_set_device_bytes(int device, uint64_t bytes) {
  if (!valid_device(device)) return -1;
  lock held = take_lock();
  set_device_total(held, device, bytes);
  return 0;
}

TAGMEM_EMU_EXPORT uint64_t tagmem_emu_device_bytes(int device) {
  if (!valid_device(device)) return 0;
  lock held = take_lock();
  return device_total(held, device);
}

TAGMEM_EMU_EXPORT uint64_t tagmem_emu_device_used_bytes(int device) {
  if (!valid_device(device)) return 0;
  lock held = take_lock();
  return device_used(held, device);
}

TAGMEM_EMU_EXPORT CUresult tagmem_emu_sticky_error(int device) {
  return valid_device(device) ? sticky_error(device) : CUDA_ERROR_INVALID_DEVICE;
}

TAGMEM_EMU_EXPORT int tagmem_emu_clear_sticky_error(int device) {
  if (!valid_device(device)) return -1;
  clear_sticky_error(device);
  return 0;
}
