// nccl_holds.cpp — tagged memory NCCL holds (see header, Note [nccl holds]).
#include "registry/nccl_holds.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "device/address_index.hpp"
#include "observe/log.hpp"
#include "tags/tag.hpp"

namespace tagmem {
bool nccl_holds::part_at(tag& t, std::uint64_t address, part_hold& out) {
  const auto& maps = t.arena().mappings();
  auto it = maps.upper_bound(address);
  if (it == maps.begin()) return false;
  --it;
  if (!it->second.resident || address >= it->first + it->second.size) return false;
  std::uint64_t at = it->first;
  for (const physical_part& p : it->second.parts) {
    if (address < at + p.size) {
      out.owner = &t;
      out.va = at;
      out.bytes = p.size;
      out.handle = p.handle;
      return true;
    }
    at += p.size;
  }
  return false;
}

std::optional<CUresult> nccl_holds::retain(std::uint64_t address,
                                           CUmemGenericAllocationHandle* handle,
                                           const std::function<CUresult()>& retain) {
  tag* t = global_address_index().find(address);
  if (!t) return std::nullopt;
  std::lock_guard tag_lock(t->mutex());
  {
    std::lock_guard lock(mutex_);
    parts_.reserve(parts_.size() + 1);  // so that a retain done is a retain recorded
  }
  const CUresult r = retain();
  if (r != CUDA_SUCCESS || !handle) return r;
  part_hold found;
  // An address in the tag's range but not in a resident mapping cannot be retained: the
  // driver refused above. A part found is where the driver's handle is.
  if (!part_at(*t, address, found)) return r;
  std::lock_guard lock(mutex_);
  auto same = [&](const part_hold& p) { return p.owner == t && p.va == found.va; };
  auto it = std::find_if(parts_.begin(), parts_.end(), same);
  if (it == parts_.end()) {
    parts_.push_back(found);
    it = parts_.end() - 1;
  }
  // A handle value names one live allocation; an entry that still shows it for memory since
  // released (the tag offloaded, the value given out again) must not take this one's calls.
  for (part_hold& other : parts_)
    if (&other != &*it && other.handle == *handle) other.handle = 0;
  it->handle = *handle;     // the same value as the part's (as the driver answers), kept as given
  it->bytes = found.bytes;  // the memory at this address now (a reload may have cut it anew)
  it->retains++;
  return r;
}

nccl_holds::part_hold* nccl_holds::by_handle(CUmemGenericAllocationHandle h) {
  if (h == 0) return nullptr;
  for (part_hold& p : parts_)
    if (p.handle == h) return &p;
  return nullptr;
}

bool nccl_holds::covered(const part_hold& p) const {
  return std::any_of(registrations_.begin(), registrations_.end(), [&](const registration& r) {
    return r.base < p.va + p.bytes && p.va < r.base + r.size;
  });
}

bool nccl_holds::retained(CUmemGenericAllocationHandle h) {
  std::lock_guard lock(mutex_);
  part_hold* p = by_handle(h);
  if (!p) return false;
  p->retains++;  // its release comes through released(), like any other
  return true;
}

bool nccl_holds::exported(CUmemGenericAllocationHandle h) {
  std::lock_guard lock(mutex_);
  part_hold* p = by_handle(h);
  if (!p) return false;
  (covered(*p) ? p->registered_export : p->graph_export) = true;
  return true;
}

bool nccl_holds::released(CUmemGenericAllocationHandle h) {
  std::lock_guard lock(mutex_);
  part_hold* p = by_handle(h);
  if (!p || p->retains == 0) return false;
  p->retains--;
  return true;
}

bool nccl_holds::mapped(CUmemGenericAllocationHandle h, std::uint64_t va) {
  std::lock_guard lock(mutex_);
  part_hold* p = by_handle(h);
  if (!p) return false;
  p->mapped_at.push_back(va);
  return true;
}

void nccl_holds::unmapped(std::uint64_t va, std::size_t size) {
  std::lock_guard lock(mutex_);
  for (part_hold& p : parts_)
    std::erase_if(p.mapped_at, [&](std::uint64_t m) { return m >= va && m < va + size; });
}

void nccl_holds::pinned(std::uint64_t va, std::size_t size, const char* by) {
  for (std::uint64_t at = va; at < va + size;) {
    tag* t = global_address_index().find(at);
    if (!t) return;
    std::lock_guard tag_lock(t->mutex());
    part_hold found;
    if (!part_at(*t, at, found)) return;
    std::lock_guard lock(mutex_);
    auto it = std::find_if(parts_.begin(), parts_.end(),
                           [&](const part_hold& p) { return p.owner == t && p.va == found.va; });
    if (it == parts_.end()) {
      parts_.push_back(found);
      it = parts_.end() - 1;
    }
    it->pinned_by = by;
    at = found.va + found.bytes;
  }
}

void nccl_holds::registered(const void* comm, const void* reg, std::uint64_t base,
                            std::size_t size) {
  if (!global_address_index().find(base)) return;
  std::lock_guard lock(mutex_);
  for (registration& r : registrations_) {
    if (r.comm == comm && r.reg == reg) {
      r.base = std::min(r.base, base);  // NCCL's registration holds both ranges
      r.size = std::max(r.base + r.size, base + size) - r.base;
      r.count++;
      return;
    }
  }
  registrations_.push_back({comm, reg, base, size, 1});
}

void nccl_holds::deregistered(const void* comm, const void* reg, bool graphs_may_share) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(registrations_.begin(), registrations_.end(),
                         [&](const registration& r) { return r.comm == comm && r.reg == reg; });
  if (it == registrations_.end() || --it->count > 0) return;
  registrations_.erase(it);
  // NCCL has unmapped the peers' registered mappings when ncclCommDeregister returns, unless a
  // graph holds the registration too.
  for (part_hold& p : parts_) {
    if (!p.registered_export || covered(p)) continue;
    p.registered_export = false;
    p.graph_export |= graphs_may_share;
  }
}

std::string nccl_holds::describe(const part_hold& p) {
  std::string what;
  auto add = [&](const std::string& s) { what += (what.empty() ? "" : "; ") + s; };
  if (p.registered_export)
    add("exported to the peer processes for a buffer registered with ncclCommRegister: "
        "ncclCommDeregister of the last registration over it ends that");
  if (p.graph_export)
    add("exported to the peer processes for a registration whose end the shim cannot see: a "
        "CUDA graph's (NCCL registers the buffers of captured collectives itself, and a graph "
        "captured in this process may share an ncclCommRegister registration; "
        "NCCL_GRAPH_REGISTER=0 avoids both), a symmetric-memory window's, or one made through a "
        "libnccl handle of the caller's own; held while this process runs");
  if (!p.mapped_at.empty())
    add("NCCL maps it at " + format_address(p.mapped_at.front()) + " for a peer in this process");
  if (p.retains > 0)
    add(std::to_string(p.retains) +
        " reference(s) taken with cuMemRetainAllocationHandle and not yet released");
  if (p.pinned_by) add(std::string("bound to ") + p.pinned_by + ", held while this process runs");
  return what;
}

void nccl_holds::refuse(const meta_vector<tag*>& tags, const char* operation) {
  std::lock_guard lock(mutex_);
  for (const part_hold& p : parts_) {
    if (std::find(tags.begin(), tags.end(), p.owner) == tags.end() || !p.held()) continue;
    fail(TAGMEM_ERROR_PEER,
         std::string("tag '") + p.owner->name() + "' cannot be " + operation + ": NCCL holds its " +
             std::to_string(p.bytes) + " bytes at " + format_address(p.va) + " (" + describe(p) +
             "); its holders would stay on the old pages while the tag reloads onto "
             "new ones");
  }
}

}  // namespace tagmem
