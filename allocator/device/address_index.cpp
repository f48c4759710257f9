// address_index.cpp — range lookup from device address to owning tag (see address_index.hpp).
#include "device/address_index.hpp"

#include <mutex>

namespace tagmem {

void address_index::add(std::uintptr_t base, std::size_t size, tag* owner) {
  std::unique_lock lock(mutex_);
  ranges_.emplace(base, range{size, owner});
}

void address_index::remove(std::uintptr_t base) noexcept {
  std::unique_lock lock(mutex_);
  ranges_.erase(base);
}

tag* address_index::find(std::uintptr_t address) const {
  std::shared_lock lock(mutex_);
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return nullptr;
  --it;
  return address - it->first < it->second.size ? it->second.owner : nullptr;
}

address_index& global_address_index() {
  static address_index* index = new address_index();  // never destroyed: used until exit
  return *index;
}

}  // namespace tagmem
