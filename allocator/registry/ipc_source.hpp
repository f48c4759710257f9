// ipc_source.hpp — the physical memory behind an exported tagged range (Note [ipc] in
// handoff/ipc_server.hpp): found through the address index, read under the owning tag's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "handoff/ipc_server.hpp"

namespace tagmem {

class tag;

// The tag whose live allocation holds all of [ptr, ptr + bytes); throws UNKNOWN_POINTER
// (INVALID_ARGUMENT for bytes == 0 or a range that runs past the allocation).
tag& tag_of_range(std::uint64_t ptr, std::uint64_t bytes);

class tag_ipc_source final : public handoff::ipc_source {
 public:
  using ended_fn = std::function<void(const std::vector<handoff::ipc_importer>&)>;
  explicit tag_ipc_source(ended_fn ended) : ended_(std::move(ended)) {}
  // Exports the parts overlapping the range (DRIVER when a handle cannot be exported: memory
  // created with TAGMEM_IPC=off; what handoff received goes as its kept descriptor, Note [one
  // hop]); TAG_OFFLOADED while the tag is offloaded.
  handoff::ipc_mapped export_parts(std::uint64_t ptr, std::uint64_t bytes, peers::owned_fds& fds,
                                   const std::function<void()>& live) override;
  void imports_ended(const std::vector<handoff::ipc_importer>& live) noexcept override {
    ended_(live);
  }

 private:
  ended_fn ended_;  // noexcept in practice: registry::ipc_imports_ended
};

}  // namespace tagmem
