// nccl_way.cpp — the driver reached as NCCL reaches it, and NCCL-style buffers (see header).
#include "nccl_way.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

namespace tagmem::preload_test {
namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "[preload tests] %s\n", what.c_str());
  std::abort();
}

void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string(call) + " failed: " + std::to_string(r));
}

template <class F>
F emu_fn(const char* name) {
  auto f = reinterpret_cast<F>(dlsym(nccl().library, name));
  if (!f) die(std::string("the driver has no ") + name + " (is TAGMEM_LIBCUDA the emulator?)");
  return f;
}

// Reserves an address range for b.handle, maps it there and lets `device` read and write it.
void map_for_device(buffer& b, int device) {
  const nccl_driver& d = nccl();
  check(d.cuMemAddressReserve(&b.va, b.size, 0, 0, 0), "cuMemAddressReserve");
  check(d.cuMemMap(b.va, b.size, 0, b.handle, 0), "cuMemMap");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(d.cuMemSetAccess(b.va, b.size, &access, 1), "cuMemSetAccess");
}

}  // namespace

const nccl_driver& nccl() {
  static const nccl_driver* d = [] {
    auto* n = new nccl_driver;
    const char* path = std::getenv("TAGMEM_LIBCUDA");
    n->library = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n->library) die(std::string("dlopen of the driver failed: ") + dlerror());
    n->get_proc_v2 =
        reinterpret_cast<decltype(n->get_proc_v2)>(dlsym(n->library, "cuGetProcAddress_v2"));
    if (!n->get_proc_v2) die("no cuGetProcAddress_v2");
    void* self = nullptr;
    CUdriverProcAddressQueryResult st{};
    if (n->get_proc_v2("cuGetProcAddress", &self, CUDA_VERSION, 0, &st) != CUDA_SUCCESS || !self)
      die("cuGetProcAddress does not find itself");
    n->get_proc = reinterpret_cast<decltype(n->get_proc)>(self);
#define TAGMEM_NCCL_WAY(name)                                                             \
  {                                                                                       \
    void* fn = nullptr;                                                                   \
    if (n->get_proc(#name, &fn, CUDA_VERSION, 0, &st) != CUDA_SUCCESS || !fn) die(#name); \
    n->name = reinterpret_cast<decltype(n->name)>(fn);                                    \
  }
#include "nccl_way_entry_points.def"
#undef TAGMEM_NCCL_WAY
    if (n->cuInit(0) != CUDA_SUCCESS) die("cuInit failed");
    return n;
  }();
  return *d;
}

void use_device(int device) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  check(nccl().cuDeviceGet(&dev, device), "cuDeviceGet");
  check(nccl().cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(nccl().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

std::uint64_t emu_device_used_bytes(int device) {
  return emu_fn<std::uint64_t (*)(int)>("tagmem_emu_device_used_bytes")(device);
}
std::uint64_t emu_live_allocations() {
  return emu_fn<std::uint64_t (*)()>("tagmem_emu_live_allocations")();
}
std::uint64_t emu_live_mappings() {
  return emu_fn<std::uint64_t (*)()>("tagmem_emu_live_mappings")();
}
void emu_fail_call(const char* entry, std::uint64_t nth, CUresult error) {
  emu_fn<int (*)(const char*, std::uint64_t, CUresult)>("tagmem_emu_fail_call")(entry, nth, error);
}
void emu_clear_faults() { emu_fn<void (*)()>("tagmem_emu_clear_faults")(); }
std::uint64_t emu_call_count(const char* entry) {
  return emu_fn<std::uint64_t (*)(const char*)>("tagmem_emu_call_count")(entry);
}
std::uint64_t emu_pinned_host_bytes() {
  return emu_fn<std::uint64_t (*)()>("tagmem_emu_pinned_host_bytes")();
}
void emu_set_copy_bytes_per_second(std::uint64_t bps) {
  emu_fn<void (*)(std::uint64_t)>("tagmem_emu_set_copy_bytes_per_second")(bps);
}

void emu_set_device_bytes(int device, std::uint64_t bytes) {
  emu_fn<int (*)(int, std::uint64_t)>("tagmem_emu_set_device_bytes")(device, bytes);
}
std::uint64_t emu_device_bytes(int device) {
  return emu_fn<std::uint64_t (*)(int)>("tagmem_emu_device_bytes")(device);
}

buffer create_buffer(int device, std::size_t size, bool exportable, bool host_located) {
  const nccl_driver& d = nccl();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = host_located ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = host_located ? 0 : device;
  prop.requestedHandleTypes =
      exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  buffer b;
  b.size = size;
  b.how = host_located ? buffer::host_located : buffer::created;
  check(d.cuMemCreate(&b.handle, size, &prop, 0), "cuMemCreate");
  map_for_device(b, device);
  return b;
}

buffer import_buffer(int device, int fd, std::size_t size) {
  const nccl_driver& d = nccl();
  buffer b;
  b.size = size;
  b.how = buffer::imported;
  check(d.cuMemImportFromShareableHandle(&b.handle,
                                         reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle");
  map_for_device(b, device);
  return b;
}

buffer classic_buffer(std::size_t size) {
  buffer b;
  b.size = size;
  b.how = buffer::classic;
  check(nccl().cuMemAlloc(&b.va, size), "cuMemAlloc");
  return b;
}

buffer second_mapping(const buffer& b, int device) {
  buffer again = b;
  map_for_device(again, device);
  return again;
}

void free_second_mapping(buffer& b) {
  check(nccl().cuMemUnmap(b.va, b.size), "cuMemUnmap");
  check(nccl().cuMemAddressFree(b.va, b.size), "cuMemAddressFree");
  b = buffer{};
}

int export_fd(const buffer& b) {
  int fd = -1;
  check(nccl().cuMemExportToShareableHandle(&fd, b.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                            0),
        "cuMemExportToShareableHandle");
  return fd;
}

void let_go_of_handle(buffer& b) {
  check(nccl().cuMemRelease(b.handle), "cuMemRelease");
  b.handle = 0;
}

void free_buffer(buffer& b) {
  const nccl_driver& d = nccl();
  if (b.how == buffer::classic) {
    check(d.cuMemFree(b.va), "cuMemFree");
    b.va = 0;
    return;
  }
  CUmemGenericAllocationHandle h = 0;
  check(d.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(b.va)),
        "cuMemRetainAllocationHandle");
  check(d.cuMemRelease(h), "cuMemRelease (retained)");
  check(d.cuMemUnmap(b.va, b.size), "cuMemUnmap");
  if (b.handle) check(d.cuMemRelease(b.handle), "cuMemRelease");
  check(d.cuMemAddressFree(b.va, b.size), "cuMemAddressFree");
  b = buffer{};
}

void write_bytes(const buffer& b, std::size_t offset, const std::vector<unsigned char>& bytes) {
  check(nccl().cuMemcpyHtoD(b.va + offset, bytes.data(), bytes.size()), "cuMemcpyHtoD");
}

std::vector<unsigned char> read_bytes(const buffer& b, std::size_t offset, std::size_t n) {
  std::vector<unsigned char> out(n);
  check(nccl().cuMemcpyDtoH(out.data(), b.va + offset, n), "cuMemcpyDtoH");
  return out;
}

std::vector<unsigned char> pattern(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t x = rng();
    std::memcpy(&v[i], &x, std::min<std::size_t>(8, n - i));
  }
  return v;
}

filled::filled(int device, std::uint64_t seed, std::size_t each, int count) {
  for (int i = 0; i < count; ++i) {
    buffers.push_back(create_buffer(device, each, i == 0));
    bytes.push_back(pattern(seed + i, each));
    write_bytes(buffers.back(), 0, bytes.back());
  }
}

filled::~filled() {
  for (buffer& b : buffers) free_buffer(b);
}

bool filled::intact() const {
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (!readable(buffers[i].va) || read_bytes(buffers[i], 0, bytes[i].size()) != bytes[i])
      return false;
  }
  return true;
}

bool filled::all_readable() const {
  for (const buffer& b : buffers)
    if (!readable(b.va)) return false;
  return true;
}

bool filled::none_readable() const {
  for (const buffer& b : buffers)
    if (readable(b.va)) return false;
  return true;
}

bool readable(CUdeviceptr address) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return false;
  bool ok = ::write(p[1], reinterpret_cast<const void*>(address), 1) == 1;
  ::close(p[0]);
  ::close(p[1]);
  return ok;
}

long open_descriptors() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                       std::filesystem::directory_iterator());
}

std::size_t rss_shmem_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stoull(line.substr(9)) * 1024;
  }
  return 0;
}

const shim_api& shim() {
  static const shim_api* a = [] {
    auto* s = new shim_api;
    auto get = [](const char* name) {
      void* f = dlsym(RTLD_DEFAULT, name);
      if (!f)
        die(std::string(name) +
            " not found: run these tests under LD_PRELOAD=libtagmem_preload.so");
      return f;
    };
    s->pause = reinterpret_cast<decltype(s->pause)>(get("tagmem_nccl_pause"));
    s->resume = reinterpret_cast<decltype(s->resume)>(get("tagmem_nccl_resume"));
    s->stats = reinterpret_cast<decltype(s->stats)>(get("tagmem_nccl_stats_get_sized"));
    s->last_error = reinterpret_cast<decltype(s->last_error)>(get("tagmem_last_error"));
    s->status_string = reinterpret_cast<decltype(s->status_string)>(get("tagmem_status_string"));
    return s;
  }();
  return *a;
}

tagmem_nccl_stats shim_stats() {
  tagmem_nccl_stats s{};
  if (shim().stats(&s, sizeof s) != TAGMEM_SUCCESS)
    die(std::string("stats: ") + shim().last_error());
  return s;
}

}  // namespace tagmem::preload_test
