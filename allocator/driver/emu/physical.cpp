// physical.cpp — cuMemCreate, cuMemRelease, export/import, properties and granularity.
//
// The memfd's name records where the allocation lives ("tagmem_emu:<location type>:<id>"), so a
// process importing the fd (Note [emu fd sharing]) recovers the location the way the real driver
// does, by asking the kernel (readlink of /proc/self/fd/N). Imported allocations do not count
// against a device here: the exporting process already counts them, and on the real driver an
// import in the same process does not add to the used bytes either (measured on an H200). With
// TAGMEM_EMU_SHARED_DEVICES, processes count together (shared_ledger.hpp): an allocation counts
// once, from its creation until no process holds it any more, whoever created it. For tests,
// tagmem_emu_hold_next_release holds the next cuMemRelease until tagmem_emu_release_held_release.
#include "physical.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "api.hpp"
#include "test_hold.hpp"

namespace tagmem::emu {
namespace {

// tagmem_emu_hold_next_release: the next cuMemRelease waits.
test_hold& held_release() {
  static test_hold h;
  return h;
}

struct handle_table {
  std::map<CUmemGenericAllocationHandle, std::shared_ptr<physical>> allocations;
  CUmemGenericAllocationHandle next = 1;
};

handle_table& t() {
  static handle_table* instance = new handle_table;  // leaked: see Note [emu locking]
  return *instance;
}

constexpr const char* memfd_prefix = "tagmem_emu:";

// The allocation behind `handle` while its memory exists, released handles included.
std::shared_ptr<physical> find_any(lock&, CUmemGenericAllocationHandle handle) {
  auto it = t().allocations.find(handle);
  return it == t().allocations.end() ? nullptr : it->second;
}

void free_if_unused(lock& held, physical& memory) {
  if (memory.handle_refs > 0 || memory.mappings > 0) return;
  ::close(memory.fd);
  if (memory.charged_device >= 0) {
    uncharge_physical(held, memory.charged_device, memory.key, memory.size, memory.imported);
  }
  --live(held).allocations;
  const CUmemGenericAllocationHandle handle = memory.handle;
  t().allocations.erase(handle);  // may destroy `memory`
}

CUmemGenericAllocationHandle track(lock& held, std::shared_ptr<physical> memory) {
  memory->handle = t().next++;
  memory->handle_refs = 1;
  ++live(held).allocations;
  t().allocations.emplace(memory->handle, memory);
  return memory->handle;
}

CUresult check_prop(const CUmemAllocationProp& prop) {
  if (prop.type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop.requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  switch (prop.location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return valid_device(prop.location.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
    case CU_MEM_LOCATION_TYPE_HOST:  // not IPC capable (documented, and measured)
      return prop.requestedHandleTypes == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      return prop.location.id >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Recovers the location from an emulator memfd's name; false for any other file.
bool parse_memfd(int fd, CUmemLocation* location) {
  char path[64];
  char target[256] = {};
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  if (::readlink(path, target, sizeof target - 1) < 0) return false;
  const std::string expected = std::string("/memfd:") + memfd_prefix;
  if (std::strncmp(target, expected.c_str(), expected.size()) != 0) return false;
  int type = 0;
  int id = 0;
  if (std::sscanf(target + expected.size(), "%d:%d", &type, &id) != 2) return false;
  location->type = static_cast<CUmemLocationType>(type);
  location->id = id;
  return true;
}

}  // namespace

std::shared_ptr<physical> find_handle(lock& held, CUmemGenericAllocationHandle handle) {
  auto memory = find_any(held, handle);
  return memory && memory->handle_refs > 0 ? memory : nullptr;
}

void retain_handle(lock&, physical& memory) { ++memory.handle_refs; }

void add_mapping(lock& held, physical& memory) {
  ++memory.mappings;
  ++live(held).mappings;
}

void remove_mapping(lock& held, physical& memory) {
  --memory.mappings;
  --live(held).mappings;
  free_if_unused(held, memory);
}

}  // namespace tagmem::emu

using namespace tagmem::emu;

TAGMEM_EMU_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity_out,
                                                         const CUmemAllocationProp* prop,
                                                         CUmemAllocationGranularity_flags option) {
  TAGMEM_EMU_ENTRY(cuMemGetAllocationGranularity);
  if (granularity_out == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity_out = granularity;  // the real driver answers even for an invalid device
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                       const CUmemAllocationProp* prop, unsigned long long flags) {
  TAGMEM_EMU_ENTRY(cuMemCreate);
  if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_prop(*prop); r != CUDA_SUCCESS) return r;
  if (size == 0 || !aligned(size, granularity)) return CUDA_ERROR_INVALID_VALUE;

  auto memory = std::make_shared<physical>();
  memory->size = size;
  memory->prop = *prop;
  memory->exportable = (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
    memory->charged_device = prop->location.id;

  lock held = take_lock();
  const std::string name =
      memfd_prefix + std::to_string(prop->location.type) + ":" + std::to_string(prop->location.id);
  memory->fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  struct stat info {};
  if (memory->fd < 0 || ::ftruncate(memory->fd, static_cast<off_t>(size)) != 0 ||
      ::fstat(memory->fd, &info) != 0) {
    if (memory->fd >= 0) ::close(memory->fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memory->key = info.st_ino;
  if (memory->charged_device >= 0 &&
      !charge_physical(held, memory->charged_device, memory->key, size, false)) {
    ::close(memory->fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *handle = track(held, std::move(memory));
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  TAGMEM_EMU_ENTRY(cuMemRelease);
  if (held_release().take()) held_release().wait();
  lock held = take_lock();
  auto memory = find_handle(held, handle);
  if (!memory) return CUDA_ERROR_INVALID_VALUE;
  --memory->handle_refs;
  free_if_unused(held, *memory);
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  TAGMEM_EMU_ENTRY(cuMemGetAllocationPropertiesFromHandle);
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  auto memory = find_any(held, handle);  // works while mapped after release, as measured
  if (!memory) return CUDA_ERROR_INVALID_VALUE;
  *prop = memory->prop;
  return CUDA_SUCCESS;
}

// Note [emu fd sharing]: a POSIX-fd shareable handle is a new dup of the memfd each time (the
// real driver too hands out a new fd per export). The receiver — this process or another one
// that got the fd over a Unix socket — imports it into a handle of its own on a dup of that fd,
// so the exporter's and the importer's lives are independent and the pages stay until the last
// fd and the last mapping in any process are gone.
TAGMEM_EMU_EXPORT CUresult cuMemExportToShareableHandle(void* shareable,
                                                        CUmemGenericAllocationHandle handle,
                                                        CUmemAllocationHandleType type,
                                                        unsigned long long flags) {
  TAGMEM_EMU_ENTRY(cuMemExportToShareableHandle);
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  lock held = take_lock();
  auto memory = find_handle(held, handle);
  // Without POSIX fds in requestedHandleTypes the real driver answers INVALID_VALUE, and so it
  // does for a handle this process imported (both measured; docs/handoff.md, "Limits").
  if (!memory || !memory->exportable) return CUDA_ERROR_INVALID_VALUE;
  const int fd = ::fcntl(memory->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                          void* os_handle,
                                                          CUmemAllocationHandleType type) {
  TAGMEM_EMU_ENTRY(cuMemImportFromShareableHandle);
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  struct stat info {};
  if (::fstat(fd, &info) != 0) return CUDA_ERROR_UNKNOWN;  // what the real driver says
  auto memory = std::make_shared<physical>();
  if (!parse_memfd(fd, &memory->prop.location)) return CUDA_ERROR_INVALID_VALUE;
  if (info.st_size <= 0 || !aligned(info.st_size, granularity)) return CUDA_ERROR_INVALID_VALUE;
  memory->size = static_cast<size_t>(info.st_size);
  memory->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  memory->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;  // reported so, as measured
  memory->exportable = false;  // the real driver does not export an imported handle again
  memory->fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (memory->fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  memory->imported = true;
  memory->key = info.st_ino;
  lock held = take_lock();
  if (memory->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
      valid_device(memory->prop.location.id)) {
    memory->charged_device = memory->prop.location.id;
    charge_physical(held, memory->charged_device, memory->key, memory->size, true);
  }
  *handle = track(held, std::move(memory));
  return CUDA_SUCCESS;
}

TAGMEM_EMU_EXPORT void tagmem_emu_hold_next_release(void) { held_release().arm(); }

TAGMEM_EMU_EXPORT void tagmem_emu_release_held_release(void) { held_release().release(); }
