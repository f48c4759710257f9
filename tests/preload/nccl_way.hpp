// nccl_way.hpp — the driver as NCCL reaches it, for tests that run under libtagmem_preload.so.
//
// NCCL's statically linked CUDA runtime opens libcuda (here TAGMEM_LIBCUDA, the emulator),
// asks dlsym for "cuGetProcAddress_v2", asks that for "cuGetProcAddress" itself and gets every
// other entry point through the answer. nccl_driver does exactly that, so what it holds is what
// the shim hands a recorded caller (this test binary is named in TAGMEM_PRELOAD_DRIVER_CALLERS).
// Buffers are created, mapped and freed the way NCCL's ncclCuMemAlloc/ncclCuMemFree do.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tagmem/tagmem_nccl.h"

namespace tagmem::preload_test {

struct nccl_driver {
  void* library = nullptr;
  CUresult (*get_proc_v2)(const char*, void**, int, cuuint64_t,
                          CUdriverProcAddressQueryResult*) = nullptr;  // from dlsym
  CUresult (*get_proc)(const char*, void**, int, cuuint64_t,
                       CUdriverProcAddressQueryResult*) = nullptr;  // its self-lookup
#define TAGMEM_NCCL_WAY(name) decltype(&::name) name = nullptr;
#include "nccl_way_entry_points.def"
#undef TAGMEM_NCCL_WAY
};

// Loads once per process; aborts the test process with a message if it cannot.
const nccl_driver& nccl();

// Makes `device`'s primary context current on this thread.
void use_device(int device);

// The emulator's control functions (found in the same library).
std::uint64_t emu_device_used_bytes(int device);
std::uint64_t emu_live_allocations();
std::uint64_t emu_live_mappings();
void emu_fail_call(const char* entry, std::uint64_t nth, CUresult error);
void emu_clear_faults();                          // disarms the faults not yet fired
std::uint64_t emu_call_count(const char* entry);  // null: every entry point
std::uint64_t emu_pinned_host_bytes();
void emu_set_copy_bytes_per_second(std::uint64_t bps);
void emu_set_device_bytes(int device, std::uint64_t bytes);
std::uint64_t emu_device_bytes(int device);

// One NCCL-style buffer: a reservation with one physical allocation mapped read-write.
struct buffer {
  CUdeviceptr va = 0;
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;  // 0 after the application let go of it
  enum kind { created, imported, classic, host_located } how = created;
};

// cuMemCreate (device or host location) + reserve + map + set access; `exportable` asks for
// POSIX fds. Throws std::runtime_error naming the failed call.
buffer create_buffer(int device, std::size_t size, bool exportable, bool host_located = false);
buffer import_buffer(int device, int fd, std::size_t size);
buffer classic_buffer(std::size_t size);  // cuMemAlloc
// Maps the memory of `b` a second time, at a new address (same handle, same bytes).
buffer second_mapping(const buffer& b, int device);
// Undoes second_mapping (unmap and free the address range; the memory stays with `b`).
void free_second_mapping(buffer& b);
int export_fd(const buffer& b);
// Drops the application's handle, as NCCL may do once a buffer is mapped.
void let_go_of_handle(buffer& b);
// Frees the way ncclCuMemFree does (retain, release, unmap, release, free the range).
void free_buffer(buffer& b);

void write_bytes(const buffer& b, std::size_t offset, const std::vector<unsigned char>& bytes);
std::vector<unsigned char> read_bytes(const buffer& b, std::size_t offset, std::size_t n);

// Deterministic pseudo-random bytes from a seed (both processes compute the same ones).
std::vector<unsigned char> pattern(std::uint64_t seed, std::size_t n);

// A few buffers with known random bytes (the first one exportable), checked whole; freed NCCL's
// way when it goes.
struct filled {
  std::vector<buffer> buffers;
  std::vector<std::vector<unsigned char>> bytes;

  filled(int device, std::uint64_t seed, std::size_t each = 4ull << 20, int count = 3);
  ~filled();
  filled(const filled&) = delete;
  filled& operator=(const filled&) = delete;
  bool intact() const;         // every buffer readable and holding its bytes
  bool all_readable() const;   // mapped, without reading the bytes (no copy)
  bool none_readable() const;  // released
};

// Whether this process can read the byte at `address` (no fault; uses a pipe, never a signal).
bool readable(CUdeviceptr address);

// The descriptors this process has open. The emulator's memory is a memfd per allocation: a
// resident buffer holds one.
long open_descriptors();

// Resident shared memory of this process (RssShmem): the emulator's device memory it maps.
std::size_t rss_shmem_bytes();

// The shim's C functions, found with dlsym(RTLD_DEFAULT) (the shim is LD_PRELOADed).
struct shim_api {
  tagmem_status (*pause)(const char*, int, int, int);
  tagmem_status (*resume)(const char*, int, int, int);
  tagmem_status (*stats)(tagmem_nccl_stats*, size_t);
  const char* (*last_error)();
  const char* (*status_string)(tagmem_status);
};
const shim_api& shim();
tagmem_nccl_stats shim_stats();

}  // namespace tagmem::preload_test
