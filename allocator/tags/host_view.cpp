// host_view.cpp — the lookup behind tagmem_host_view() (see host_view.hpp).
#include "tags/host_view.hpp"

#include <algorithm>
#include <string>

#include "base/error.hpp"
#include "tags/backup_retention.hpp"

namespace tagmem {

host_span backup_span(tag& t, CUdeviceptr address, CUdeviceptr end, bool writable) {
  const std::string name = t.name();
  if (!t.offloaded()) {
    // A resident tag's kept backup (backup_retention.hpp) is a snapshot: readable, but nothing
    // written there would reach the device.
    const bool kept = kept_backup_current(t);
    const char* why = kept       ? " (its kept backup is a read-only snapshot)"
                      : t.kept() ? " (it allocated or freed since its kept backup was made)"
                                 : "";
    TAGMEM_EXPECTS(
        kept && !writable, TAGMEM_ERROR_TAG_RESIDENT,
        "tagmem_host_view: tag '" + name + "' is resident: its bytes are on the device" + why);
  } else {
    // Before the partial test: offloaded alone, a replica keeps mapped what lies in shares the
    // others have not written yet, and the answer must not depend on how far they have got.
    TAGMEM_EXPECTS(!t.replication() || t.mode() != TAGMEM_BACKUP || !t.pieces().empty(),
                   TAGMEM_ERROR_TAG_OFFLOADED,
                   "tagmem_host_view: tag '" + name +
                       "' is offloaded through its replicas' shared host copy, which host views "
                       "do not read");
    TAGMEM_EXPECTS(!t.partial(), TAGMEM_ERROR_TAG_RESIDENT,
                   "tagmem_host_view: tag '" + name +
                       "' is only partly offloaded: some of its bytes are on the device");
  }
  TAGMEM_EXPECTS(
      t.mode() == TAGMEM_BACKUP, TAGMEM_ERROR_TAG_OFFLOADED,
      "tagmem_host_view: tag '" + name + "' was offloaded with TAGMEM_DISCARD: no bytes were kept");
  const auto& pieces = t.pieces();
  auto after = std::upper_bound(pieces.begin(), pieces.end(), address,
                                [](CUdeviceptr a, const backup_piece& p) { return a < p.dev; });
  const bool held = after != pieces.begin() && address < (after - 1)->dev + (after - 1)->bytes;
  // A tag whose offload stopped part way and was then reloaded keeps only the part that left
  // the device: the rest never had a backup.
  TAGMEM_EXPECTS(held || t.offloaded(), TAGMEM_ERROR_TAG_RESIDENT,
                 "tagmem_host_view: tag '" + name +
                     "' is resident and its kept backup does not "
                     "hold address " +
                     std::to_string(address) +
                     " (its last offload stopped part way: that part never left the device)");
  TAGMEM_EXPECTS(held, TAGMEM_ERROR_INTERNAL,
                 "tagmem_host_view: no backup piece of tag '" + name + "' holds address " +
                     std::to_string(address));
  auto it = after - 1;
  host_span span{it->host + (address - it->dev), it->dev + it->bytes - address};
  // Neighbouring pieces often continue each other (one extent cut into copy pieces): report
  // them as one run so most callers need a single call.
  for (auto next = it + 1; next != pieces.end() && address + span.bytes < end; it = next++) {
    if (next->dev != it->dev + it->bytes || next->host != it->host + it->bytes) break;
    span.bytes += next->bytes;
  }
  span.bytes = std::min<std::size_t>(span.bytes, end - address);
  return span;
}

}  // namespace tagmem
