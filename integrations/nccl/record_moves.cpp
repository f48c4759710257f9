// record_moves.cpp — detach, reattach and finish the release of one record (see header).
#include "record_moves.hpp"

#include <cstdio>
#include <new>
#include <string>

#include "api/runtime.hpp"

namespace tagmem::nccl {
namespace {

meta_vector<CUmemGenericAllocationHandle>& leftovers() {
  static auto* v = new meta_vector<CUmemGenericAllocationHandle>;  // guarded by records' mutex
  return *v;
}

std::string where(const mapping_record& m) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(m.va));
  return text;
}

// Maps one recorded mapping back with its access; the driver's error, with the mapping undone.
CUresult map_one(const mapping_record& m, CUmemGenericAllocationHandle handle) {
  const auto& api = driver::api();
  if (CUresult r = api.cuMemMap(m.va, m.size, m.offset, handle, 0); r != CUDA_SUCCESS) return r;
  if (!m.access.empty()) {
    if (CUresult r = api.cuMemSetAccess(m.va, m.size, m.access.data(), m.access.size());
        r != CUDA_SUCCESS) {
      api.cuMemUnmap(m.va, m.size);
      return r;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

void map_everywhere(const allocation& a, CUmemGenericAllocationHandle handle) {
  std::size_t mapped = 0;
  for (const mapping_record& m : a.mappings) {
    if (CUresult r = map_one(m, handle); r != CUDA_SUCCESS) {
      for (std::size_t i = 0; i < mapped; ++i)
        driver::api().cuMemUnmap(a.mappings[i].va, a.mappings[i].size);
      fail(TAGMEM_ERROR_DRIVER, "mapping buffer " + std::to_string(a.id) + " at " + where(m) +
                                    " failed: " + driver::describe(r));
    }
    ++mapped;
  }
}

void release_or_keep(CUmemGenericAllocationHandle handle) {
  if (driver::api().cuMemRelease(handle) == CUDA_SUCCESS) return;
  try {
    leftovers().push_back(handle);
  } catch (const std::bad_alloc&) {
    // Nowhere to remember it: the reference stays with the driver for the process's life.
  }
}

void drop_leftovers() noexcept {
  auto& v = leftovers();
  std::erase_if(v, [](CUmemGenericAllocationHandle h) {
    return driver::api().cuMemRelease(h) == CUDA_SUCCESS;
  });
}

detached detach(allocation& a) {
  const auto& api = driver::api();
  detached d{&a, a.real, false};
  if (!a.real_held) {
    // NCCL holds no handle: without one of ours, the last unmap would free the bytes.
    if (a.mappings.empty()) fail(TAGMEM_ERROR_INTERNAL, "a released record has no mapping");
    CUresult r =
        api.cuMemRetainAllocationHandle(&d.handle, reinterpret_cast<void*>(a.mappings.front().va));
    if (r != CUDA_SUCCESS)
      fail(TAGMEM_ERROR_DRIVER, "cuMemRetainAllocationHandle(" + where(a.mappings.front()) +
                                    "): " + driver::describe(r));
    d.borrowed = true;
  }
  for (std::size_t i = 0; i < a.mappings.size(); ++i) {
    const mapping_record& m = a.mappings[i];
    CUresult r = api.cuMemUnmap(m.va, m.size);
    if (r == CUDA_SUCCESS) continue;
    std::string message = "cuMemUnmap(" + where(m) + "): " + driver::describe(r);
    for (std::size_t k = 0; k < i; ++k) {
      if (CUresult back = map_one(a.mappings[k], d.handle); back != CUDA_SUCCESS) {
        message += "; mapping " + where(a.mappings[k]) + " back failed too (" +
                   driver::describe(back) + "): that address of buffer " + std::to_string(a.id) +
                   " stays unmapped";
      }
    }
    if (d.borrowed) release_or_keep(d.handle);
    fail(TAGMEM_ERROR_DRIVER, message);
  }
  return d;
}

void reattach(const detached& d) { map_everywhere(*d.a, d.handle); }

void end_borrow(const detached& d) {
  if (d.borrowed) release_or_keep(d.handle);
}

void finish_release(const detached& d) {
  allocation& a = *d.a;
  release_or_keep(d.handle);
  a.real = 0;
  a.real_held = false;
  a.released = true;
  for (const export_record& e : a.exports) close_quietly(e.fd);
  a.exports.clear();
  close_quietly(a.import_fd);
  a.import_fd = -1;
}

}  // namespace tagmem::nccl
