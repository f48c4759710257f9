// address_index.hpp — which tag owns a device address.
//
// Every virtual range a tag reserves is entered here, so tagmem_free() and
// tagmem_pointer_info() find the owning tag from any pointer with one ordered-map lookup under
// a shared lock, without touching any tag's lock. Owners outlive their entries (tags are only
// destroyed at shutdown, after their ranges are removed).
#pragma once

#include <cstdint>
#include <shared_mutex>

#include "host/metadata_heap.hpp"

namespace tagmem {

class tag;

class address_index {
 public:
  void add(std::uintptr_t base, std::size_t size, tag* owner);
  void remove(std::uintptr_t base) noexcept;
  tag* find(std::uintptr_t address) const;  // nullptr when no range holds it

 private:
  struct range {
    std::size_t size;
    tag* owner;
  };
  mutable std::shared_mutex mutex_;
  meta_map<std::uintptr_t, range> ranges_;  // keyed by base
};

address_index& global_address_index();

}  // namespace tagmem
