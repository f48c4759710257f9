// physical_recycler.cpp — kept physical handles and composite mappings (Note [physical
// recycling] in physical_recycler.hpp).
#include "physical_recycler.hpp"

#include "device.hpp"
#include "driver/driver.hpp"
#include "error.hpp"
#include "release_clock.hpp"

namespace tagmem {

physical_recycler::~physical_recycler() {
  for (auto& [size, h] : kept_) driver::api().cuMemRelease(h);
}

bool physical_recycler::put(physical_part p) noexcept {
  std::lock_guard lock(mutex_);
  try {
    kept_.emplace(p.size, p.handle);
  } catch (...) {
    return false;
  }
  bytes_ += p.size;
  return true;
}

void physical_recycler::take_up_to(std::size_t bytes, meta_vector<physical_part>& out) {
  std::lock_guard lock(mutex_);
  if (kept_.empty()) return;
  // Room first, so that nothing is taken out of kept_ that cannot be handed over.
  const std::size_t start = out.size();
  out.reserve(start + std::min(kept_.size(), bytes / kept_.begin()->first));
  std::size_t left = bytes;
  while (left != 0 && !kept_.empty()) {
    auto it = kept_.upper_bound(left);  // the largest handle that fits in what is left
    if (it == kept_.begin()) break;
    --it;
    out.push_back({it->second, it->first});  // within the room reserved above
    left -= it->first;
    bytes_ -= it->first;
    kept_.erase(it);
  }
}

void physical_recycler::release_all(release_queue& q) noexcept {
  decltype(kept_) all(kept_.get_allocator());
  {
    std::lock_guard lock(mutex_);
    all.swap(kept_);
    bytes_ = 0;
  }
  for (auto& [size, h] : all) {
    try {
      q.push(h, size);
      continue;
    } catch (...) {  // the thread cannot take it: release it here
    }
    if (driver::api().cuMemRelease(h) != CUDA_SUCCESS) {
      std::lock_guard lock(mutex_);
      try {
        kept_.emplace(size, h);  // kept for the next attempt rather than leaked
        bytes_ += size;
      } catch (...) {
      }
    }
  }
}

CUresult physical_recycler::release_now(std::size_t bytes) noexcept {
  std::size_t released = 0;
  CUresult first = CUDA_SUCCESS;
  std::lock_guard lock(mutex_);
  for (auto it = kept_.begin(); it != kept_.end() && released < bytes;) {
    CUresult r = release_clock::release(it->second, it->first);
    if (r != CUDA_SUCCESS) {
      if (first == CUDA_SUCCESS) first = r;
      ++it;  // kept: a later attempt may succeed
      continue;
    }
    released += it->first;
    bytes_ -= it->first;
    it = kept_.erase(it);
  }
  return first;
}

std::size_t physical_recycler::bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return bytes_;
}

namespace {

// cuMemCreate of `bytes`; when the device is out of memory, kept handles and pending releases go
// back to the driver first and it tries once more.
CUmemGenericAllocationHandle create(device& dev, std::size_t bytes) {
  const auto& api = driver::api();
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = api.cuMemCreate(&handle, bytes, &dev.allocation_prop(), 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY &&
      (dev.recycler().bytes() != 0 || dev.releases().pending_bytes() != 0)) {
    dev.recycler().release_now(bytes);
    dev.releases().drain();  // Note [background release]
    r = api.cuMemCreate(&handle, bytes, &dev.allocation_prop(), 0);
  }
  driver::check(r, "cuMemCreate");
  return handle;
}

void dispose(device& dev, const physical_part& p, bool recycle) noexcept {
  if (recycle && dev.recycler().put(p)) return;
  if (release_clock::release(p.handle, p.size) == CUDA_SUCCESS) return;
  try {
    dev.releases().push(p.handle, p.size);  // tried again in the background and by every drain
  } catch (...) {  // no memory even for that record: the handle leaks, nothing else is lost
  }
}

}  // namespace

meta_vector<physical_part> map_parts(device& dev, CUdeviceptr va, std::size_t bytes, bool recycle) {
  const auto& api = driver::api();
  meta_vector<physical_part> parts;
  parts.reserve(1);
  if (recycle) dev.recycler().take_up_to(bytes, parts);
  std::size_t mapped = 0, at = 0;  // parts [0, mapped) are mapped, over [va, va + at)
  std::size_t taken = parts.size();
  auto undo = [&] {
    const bool unmapped = at == 0 || api.cuMemUnmap(va, at) == CUDA_SUCCESS;
    for (std::size_t i = 0; i < parts.size(); ++i) dispose(dev, parts[i], i < taken && unmapped);
  };
  try {
    std::size_t covered = 0;
    for (const physical_part& p : parts) covered += p.size;
    if (covered < bytes) {
      parts.reserve(parts.size() + 1);
      parts.push_back({create(dev, bytes - covered), bytes - covered});
    }
    for (; mapped < parts.size(); ++mapped) {
      CUresult r = api.cuMemMap(va + at, parts[mapped].size, 0, parts[mapped].handle, 0);
      if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemMap");
      at += parts[mapped].size;
    }
    CUresult r = api.cuMemSetAccess(va, bytes, &dev.access_desc(), 1);
    if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemSetAccess");
  } catch (...) {
    undo();
    throw;
  }
  return parts;
}

void unmap_parts(device& dev, CUdeviceptr va, std::size_t bytes,
                 const meta_vector<physical_part>& parts, bool recycle) noexcept {
  const bool unmapped = driver::api().cuMemUnmap(va, bytes) == CUDA_SUCCESS;
  for (const physical_part& p : parts) dispose(dev, p, recycle && unmapped);
}

}  // namespace tagmem
