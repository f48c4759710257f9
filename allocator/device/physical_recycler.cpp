// physical_recycler.cpp — kept physical handles and composite mappings (Note [physical
// recycling] in physical_recycler.hpp).
#include "device/physical_recycler.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "device/device.hpp"
#include "device/physical_flow.hpp"
#include "device/received_fds.hpp"
#include "device/release_clock.hpp"
#include "device/release_queue.hpp"
#include "driver/driver.hpp"
#include "observe/trace.hpp"

namespace tagmem {

physical_recycler::~physical_recycler() {
  unpark_all_locked();  // no other thread can see the recycler any more
  for (auto& [size, h] : kept_) received_fds::release_handle(h);
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

bool physical_recycler::park(CUdeviceptr va, std::size_t size, meta_vector<physical_part>& parts,
                             bool ahead) noexcept {
  std::lock_guard lock(mutex_);
  try {
    auto [it, inserted] = parked_.try_emplace(va);  // the record first: nothing moved if it throws
    if (!inserted) return false;
    it->second.size = size;
    it->second.parts.swap(parts);
    it->second.ahead = ahead;
    if (ahead) it->second.since = std::chrono::steady_clock::now();
  } catch (...) {
    return false;
  }
  bytes_ += size;
  parked_bytes_ += size;
  if (ahead) ahead_bytes_ += size;
  return true;
}

bool physical_recycler::reclaim(CUdeviceptr va, meta_vector<physical_part>& out) noexcept {
  std::lock_guard lock(mutex_);
  auto it = parked_.find(va);
  if (it == parked_.end()) return false;
  out.clear();
  out.swap(it->second.parts);
  bytes_ -= it->second.size;
  parked_bytes_ -= it->second.size;
  if (it->second.ahead) ahead_bytes_ -= it->second.size;
  parked_.erase(it);
  return true;
}

std::size_t physical_recycler::release_ahead_before(std::chrono::steady_clock::time_point cutoff,
                                                    release_queue& q) noexcept {
  meta_vector<physical_part> gone;
  std::size_t released = 0;
  {
    std::lock_guard lock(mutex_);
    if (ahead_bytes_ == 0) return 0;
    for (auto it = parked_.begin(); it != parked_.end();) {
      parked_mapping& m = it->second;
      if (!m.ahead || m.since >= cutoff) {
        ++it;
        continue;
      }
      try {
        gone.reserve(gone.size() + m.parts.size());
      } catch (...) {
        break;  // no room for the list: the next call tries again
      }
      if (driver::api().cuMemUnmap(it->first, m.size) != CUDA_SUCCESS) {
        ++it;  // stays parked: its tag's reload or a later call takes it
        continue;
      }
      gone.insert(gone.end(), m.parts.begin(), m.parts.end());  // within the room reserved
      bytes_ -= m.size;
      parked_bytes_ -= m.size;
      ahead_bytes_ -= m.size;
      released += m.size;
      it = parked_.erase(it);
    }
  }
  hand_to_queue(gone, q);
  return released;
}

void physical_recycler::hand_to_queue(meta_vector<physical_part>& parts,
                                      release_queue& q) noexcept {
  for (const physical_part& p : parts) {
    try {
      q.push(p.handle, p.size);
      continue;
    } catch (...) {  // the thread cannot take it: release it here
    }
    received_fds::release_handle(p.handle);
  }
  parts.clear();
}

CUresult physical_recycler::unpark_first_locked() noexcept {
  auto it = parked_.begin();
  CUresult r = driver::api().cuMemUnmap(it->first, it->second.size);
  if (r != CUDA_SUCCESS) return r;
  for (const physical_part& p : it->second.parts) {
    try {
      kept_.emplace(p.size, p.handle);
      continue;
    } catch (...) {  // no room for the record: the handle goes back to the driver instead
    }
    bytes_ -= p.size;
    // If this fails too the handle leaks: there is no room to keep a record of it.
    release_clock::release(p.handle, p.size);
  }
  parked_bytes_ -= it->second.size;
  if (it->second.ahead) ahead_bytes_ -= it->second.size;
  parked_.erase(it);
  return CUDA_SUCCESS;
}

CUresult physical_recycler::unpark_all_locked(bool with_ahead) noexcept {
  CUresult first = CUDA_SUCCESS;
  // A mapping whose unmap fails stays parked, first in line: move past it by address; so does
  // one parked ahead when those stay.
  meta_map<CUdeviceptr, parked_mapping> stuck(parked_.get_allocator());
  while (!parked_.empty()) {
    if (!with_ahead && parked_.begin()->second.ahead) {
      stuck.insert(parked_.extract(parked_.begin()));  // a node move: cannot fail
      continue;
    }
    CUresult r = unpark_first_locked();
    if (r == CUDA_SUCCESS) continue;
    if (first == CUDA_SUCCESS) first = r;
    stuck.insert(parked_.extract(parked_.begin()));
  }
  parked_.merge(stuck);
  return first;
}

void physical_recycler::take_up_to(std::size_t bytes, meta_vector<physical_part>& out) {
  std::lock_guard lock(mutex_);
  if (kept_.empty() && parked_.empty()) return;
  // Room first, so that nothing is taken out of kept_ that cannot be handed over.
  const std::size_t start = out.size();
  const std::size_t most = kept_.size() + parked_.size();  // parked mappings: one part each, mostly
  out.reserve(start + std::max<std::size_t>(1, std::min(most, bytes / (2u << 20))));
  std::size_t left = bytes;
  auto take_kept = [&] {
    while (left != 0 && !kept_.empty() && out.size() < out.capacity()) {
      auto it = kept_.upper_bound(left);  // the largest handle that fits in what is left
      if (it == kept_.begin()) break;
      --it;
      out.push_back({it->second, it->first});  // within the room reserved above
      left -= it->first;
      bytes_ -= it->first;
      kept_.erase(it);
    }
  };
  take_kept();
  // Then parked mappings, oldest first (Note [parked mappings]), while one of their handles fits.
  meta_map<CUdeviceptr, parked_mapping> stuck(parked_.get_allocator());
  while (left != 0 && !parked_.empty() && out.size() < out.capacity()) {
    bool fits = false;  // a mapping parked ahead is its tag's (Note [mapped ahead])
    for (const physical_part& p : parked_.begin()->second.parts) fits |= p.size <= left;
    fits &= !parked_.begin()->second.ahead;
    if (!fits || unpark_first_locked() != CUDA_SUCCESS) {
      stuck.insert(parked_.extract(parked_.begin()));  // left parked; a node move cannot fail
      continue;
    }
    take_kept();
  }
  parked_.merge(stuck);
}

void physical_recycler::release_all(release_queue& q, bool with_ahead) noexcept {
  decltype(kept_) all(kept_.get_allocator());
  {
    std::lock_guard lock(mutex_);
    unpark_all_locked(with_ahead);  // one that fails to unmap stays parked, for the next attempt
    all.swap(kept_);
    bytes_ = parked_bytes_;
  }
  for (auto& [size, h] : all) {
    try {
      q.push(h, size);
      continue;
    } catch (...) {  // the thread cannot take it: release it here
    }
    if (received_fds::release_handle(h) != CUDA_SUCCESS) {
      std::lock_guard lock(mutex_);
      try {
        kept_.emplace(size, h);  // kept for the next attempt rather than leaked
        bytes_ += size;
      } catch (...) {
      }
    }
  }
}

CUresult physical_recycler::release_now(std::size_t bytes, bool with_ahead) noexcept {
  std::size_t released = 0;
  CUresult first = CUDA_SUCCESS;
  std::lock_guard lock(mutex_);
  // Mappings parked ahead wait aside when they stay (node moves: cannot fail).
  meta_map<CUdeviceptr, parked_mapping> aside(parked_.get_allocator());
  for (auto it = parked_.begin(); !with_ahead && it != parked_.end();) {
    auto next = std::next(it);
    if (it->second.ahead) aside.insert(parked_.extract(it));
    it = next;
  }
  for (;;) {
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
    if (released >= bytes || parked_.empty()) break;
    // Not enough unmapped: the next parked mapping (Note [parked mappings]).
    CUresult r = unpark_first_locked();
    if (r != CUDA_SUCCESS) {
      if (first == CUDA_SUCCESS) first = r;
      break;
    }
  }
  parked_.merge(aside);
  return first;
}

std::size_t physical_recycler::bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return bytes_;
}

std::size_t physical_recycler::parked_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return parked_bytes_;
}

namespace {

// cuMemCreate of `bytes`; when the device is out of memory, kept handles and pending releases go
// back to the driver first and it tries once more. So do received handles, unless the caller maps
// from them (`from`: a reload, whose later runs may still use them); then, if `room` allows, one
// of them that this range could not use goes, for room to create the part the others leave.
CUmemGenericAllocationHandle create(device& dev, std::size_t bytes, physical_source* from,
                                    room_leave* room) {
  trace::span span("create", nullptr, bytes);  // within its map's span: what a run created
  const auto& api = driver::api();
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = api.cuMemCreate(&handle, bytes, &dev.allocation_prop(), 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && !from && dev.peers() && dev.peers()->held().bytes() != 0) {
    dev.peers()->release_unfit(0);  // to the release queue, drained below
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY && from && room && room->allowed &&
      from->release_one(bytes, room->arrivals_seen)) {  // to the release queue, drained below
    room->allowed = false;
  }
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

meta_vector<physical_part> map_parts(device& dev, CUdeviceptr va, std::size_t bytes, bool recycle,
                                     physical_source* from, room_leave* room, bool access,
                                     map_limits limits) {
  const auto& api = driver::api();
  meta_vector<physical_part> parts;
  parts.reserve(1);
  if (recycle) dev.recycler().take_up_to(bytes, parts);
  std::size_t received = 0;  // bytes taken from `from`, parts [from_begin, from_end)
  std::size_t from_begin = parts.size(), from_end = parts.size();
  if (from) {
    std::size_t covered = 0;
    for (const physical_part& p : parts) covered += p.size;
    if (covered < bytes) from->take_up_to(std::min(bytes - covered, limits.most_received), parts);
    from_end = parts.size();
    for (std::size_t i = from_begin; i < from_end; ++i) received += parts[i].size;
  }
  std::size_t mapped = 0, at = 0;  // parts [0, mapped) are mapped, over [va, va + at)
  std::size_t taken = parts.size();
  // A run that cannot be completed (a reload waiting for more memory from the job's processes:
  // Note [reload waits for peers]) gives back the received handles it took, for its next try,
  // rather than to the driver.
  auto undo = [&] {
    const bool unmapped = at == 0 || api.cuMemUnmap(va, at) == CUDA_SUCCESS;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (unmapped && i >= from_begin && i < from_end && from->put_back(parts[i])) continue;
      dispose(dev, parts[i], i < taken && unmapped);
    }
  };
  try {
    std::size_t covered = 0;
    for (const physical_part& p : parts) covered += p.size;
    if (bytes - covered > limits.most_created) {  // left alone: what was taken goes back
      undo();
      parts.clear();
      return parts;
    }
    if (covered < bytes) {
      parts.reserve(parts.size() + 1);
      parts.push_back({create(dev, bytes - covered, from, room), bytes - covered});
    }
    for (; mapped < parts.size(); ++mapped) {
      CUresult r = api.cuMemMap(va + at, parts[mapped].size, 0, parts[mapped].handle, 0);
      if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemMap");
      at += parts[mapped].size;
    }
    if (access) {
      CUresult r = api.cuMemSetAccess(va, bytes, &dev.access_desc(), 1);
      if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemSetAccess");
    }
  } catch (...) {
    undo();
    throw;
  }
  if (received) from->mapped(received);
  return parts;
}

void unmap_parts(device& dev, CUdeviceptr va, std::size_t bytes,
                 const meta_vector<physical_part>& parts, bool recycle) noexcept {
  const bool unmapped = driver::api().cuMemUnmap(va, bytes) == CUDA_SUCCESS;
  for (const physical_part& p : parts) dispose(dev, p, recycle && unmapped);
}

}  // namespace tagmem
