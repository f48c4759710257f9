// records.cpp — the record table (see records.hpp).
#include "records.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "backup_extents.hpp"

namespace tagmem::nccl {

record_table& records() {
  // Leaked: NCCL's proxy threads may still call wrapped entry points while the process exits.
  static record_table* table = new record_table;
  return *table;
}

void close_quietly(int fd) noexcept {
  if (fd < 0) return;
  int saved = errno;
  ::close(fd);
  errno = saved;
}

allocation& record_table::add(origin from, CUmemGenericAllocationHandle real, std::size_t size,
                              const CUmemAllocationProp& prop) {
  auto a = std::make_unique<allocation>();
  a->id = next_id_++;
  a->from = from;
  a->visible = kVisibleTag | a->id;
  a->real = real;
  a->real_held = real != 0;
  a->size = size;
  a->prop = prop;
  a->home_device = from == origin::imported ? -1 : prop.location.id;
  allocation& out = *a;
  by_id_.emplace(out.id, std::move(a));
  return out;
}

allocation* record_table::by_visible(CUmemGenericAllocationHandle handle) {
  if ((handle & ~0xffffffffffffull) != kVisibleTag) return nullptr;
  return by_id(handle & 0xffffffffffffull);
}

allocation* record_table::by_id(std::uint64_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

allocation* record_table::by_address(CUdeviceptr address, mapping_record** mapping) {
  auto it = by_va_.upper_bound(address);
  if (it == by_va_.begin()) return nullptr;
  --it;
  allocation* a = it->second;
  for (mapping_record& m : a->mappings) {
    if (m.va == it->first && address < m.va + m.size) {
      if (mapping) *mapping = &m;
      return a;
    }
  }
  return nullptr;
}

meta_vector<allocation*> record_table::mapped_in(CUdeviceptr va, std::size_t size) {
  meta_vector<allocation*> out;
  for (auto it = by_va_.lower_bound(va); it != by_va_.end() && it->first < va + size; ++it) {
    // Once each, also when its mappings are not adjacent (A, B, A): callers may erase a record
    // while walking the list.
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  return out;
}

void record_table::add_mapping(allocation& a, CUdeviceptr va, std::size_t size,
                               std::size_t offset) {
  a.mappings.push_back({va, size, offset, {}});
  by_va_[va] = &a;
  if (a.from == origin::imported && offset + size > a.size) a.size = offset + size;
}

void record_table::remove_mapping(allocation& a, CUdeviceptr va) {
  std::erase_if(a.mappings, [&](const mapping_record& m) { return m.va == va; });
  auto it = by_va_.find(va);
  if (it != by_va_.end() && it->second == &a) by_va_.erase(it);
}

void record_table::erase(allocation& a) noexcept {
  for (const mapping_record& m : a.mappings) {
    auto it = by_va_.find(m.va);
    if (it != by_va_.end() && it->second == &a) by_va_.erase(it);
  }
  for (const export_record& e : a.exports) close_quietly(e.fd);
  close_quietly(a.import_fd);
  return_backup(a.backup);
  by_id_.erase(a.id);
}

bool record_table::erase_if_unreachable(allocation& a) noexcept {
  if (a.app_refs > 0 || !a.mappings.empty()) return false;
  erase(a);
  return true;
}

}  // namespace tagmem::nccl
