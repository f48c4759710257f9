// ipc_source.cpp — the parts behind an exported range (see header).
#include "registry/ipc_source.hpp"

#include <mutex>

#include "device/address_index.hpp"
#include "device/received_fds.hpp"
#include "driver/driver.hpp"
#include "tags/tag.hpp"

namespace tagmem {

tag& tag_of_range(std::uint64_t ptr, std::uint64_t bytes) {
  TAGMEM_EXPECTS(bytes > 0, TAGMEM_ERROR_INVALID_ARGUMENT, "an IPC export of 0 bytes");
  tag* t = global_address_index().find(ptr);
  TAGMEM_EXPECTS(t, TAGMEM_ERROR_UNKNOWN_POINTER,
                 "address " + std::to_string(ptr) + " was not allocated by tagmem");
  return *t;
}

namespace {

// The live allocation holding the range; the caller holds the tag's lock.
void check_inside(tag& t, std::uint64_t ptr, std::uint64_t bytes) {
  const block* b = t.pool().find_containing(ptr);
  TAGMEM_EXPECTS(b, TAGMEM_ERROR_UNKNOWN_POINTER,
                 "address " + std::to_string(ptr) + " in tag '" + t.name() +
                     "' is not inside a live allocation (it was freed)");
  TAGMEM_EXPECTS(bytes <= b->size - (ptr - b->ptr), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "the range of " + std::to_string(bytes) + " bytes at " + std::to_string(ptr) +
                     " runs past its allocation in tag '" + t.name() + "'");
}

}  // namespace

handoff::ipc_mapped tag_ipc_source::export_parts(std::uint64_t ptr, std::uint64_t bytes,
                                                 peers::owned_fds& fds,
                                                 const std::function<void()>& live) {
  tag& t = tag_of_range(ptr, bytes);
  std::lock_guard lock(t.mutex());
  check_inside(t, ptr, bytes);
  TAGMEM_EXPECTS(!t.offloaded(), TAGMEM_ERROR_TAG_OFFLOADED,
                 std::string("tag '") + t.name() +
                     "' is offloaded; the exporting process reloads it before it can be opened");
  const auto& maps = t.arena().mappings();
  auto it = maps.upper_bound(ptr);
  TAGMEM_EXPECTS(it != maps.begin(), TAGMEM_ERROR_INTERNAL, "a live allocation without a mapping");
  --it;
  handoff::ipc_mapped out;
  out.bytes = bytes;
  const std::uint64_t end = ptr + bytes;
  std::uint64_t at = it->first;  // where the next part starts
  std::uint64_t first = 0;       // where the first part sent starts
  context_guard guard(t.dev().context());
  for (; it != maps.end() && at < end; ++it) {
    TAGMEM_EXPECTS(it->first == at && it->second.resident, TAGMEM_ERROR_INTERNAL,
                   "an allocation over mappings that are not side by side and resident");
    for (const physical_part& p : it->second.parts) {
      const std::uint64_t part_end = at + p.size;
      if (part_end > ptr && at < end) {
        if (out.sizes.empty()) first = at;
        TAGMEM_EXPECTS(out.sizes.size() < handoff::kMaxIpcParts, TAGMEM_ERROR_INVALID_ARGUMENT,
                       "the range lies over more than " + std::to_string(handoff::kMaxIpcParts) +
                           " physical handles; export smaller pieces");
        CUresult r = CUDA_ERROR_UNKNOWN;
        const int fd = received_fds::shareable_fd(p.handle, &r);  // Note [one hop]
        if (fd < 0) {
          fail(TAGMEM_ERROR_DRIVER, "cuMemExportToShareableHandle failed with " +
                                        driver::describe(r) + " in tag '" + t.name() +
                                        "': its memory was created with TAGMEM_IPC=off");
        }
        fds.push_back(fd);
        out.sizes.push_back(p.size);
      }
      at = part_end;
    }
  }
  TAGMEM_EXPECTS(at >= end && !out.sizes.empty(), TAGMEM_ERROR_INTERNAL,
                 "an allocation past its mappings");
  out.offset = ptr - first;
  live();
  return out;
}

}  // namespace tagmem
