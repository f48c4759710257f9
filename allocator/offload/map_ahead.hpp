// map_ahead.hpp — the mapping half of a DISCARD tag's reload, done as handed memory arrives.
//
// Note [mapped ahead]: a DISCARD reload has nothing to copy; what it costs is mapping its runs
// and cuMemSetAccess over them, and the second grows with the bytes (about 1 ms per 13 GiB on an
// H200: docs/handoff.md), so a 60 GiB kv cache does not come back in a few milliseconds even when
// all of its memory was handed over by the job's other process (Note [handoff] in
// handoff/service.hpp). That memory arrives while the tag is still offloaded, typically while the
// other process pauses and long before this one resumes. With TAGMEM_HANDOFF_MAP_AHEAD=on (the
// default with handoff) a thread of the registry maps it then: each offloaded DISCARD tag's
// records that a held handle fits in get held handles, largest first, and one new handle for the
// rest of the record, are given access and parked with the recycler, marked as mapped ahead (Note
// [parked mappings]). What the giver hands over (what it offered and this process wants) is
// spread over the tag's records in proportion to their sizes, and a record is mapped once its
// share has arrived: mapped as each handle came, the first records would be made whole and the
// later ones get nothing (and the giver's later handles, no longer wanted, would go to the
// driver). The tag's reload takes them back with no driver call at
// all, and maps only the records nothing arrived for. What this changes:
//  - the memory is the tag's before its reload. A record gets new memory (the rest beside the
//    handed handles) only while the device has that much free and 1 GiB more, so that mapping
//    ahead does not take the last of the device from an allocation of this or another process;
//    and anything of the process that runs out of device memory unparks and releases it first,
//    as it does every parked mapping;
//  - memory mapped ahead and not reloaded within TAGMEM_HANDOFF_HOLD_MS goes back to the driver,
//    as received memory held unmapped does, so a process that does not reload does not keep it;
//  - the tag is offloaded all along: its statistics count the bytes as parked, and the process
//    asks the job's processes only for what its offloaded tags still lack;
//  - a reload, swap or free of the tag waits for the tag's lock as against any operation; the
//    thread only tries the lock, so it never delays them.
#pragma once

#include <cstddef>

namespace tagmem {

class device;
class physical_source;
class tag;

// Maps what `from` holds into `t`'s records as the Note says. `coming`: the bytes still expected
// from the giver being served (0: none). `t` must be an offloaded DISCARD tag of `dev` whose lock
// the caller holds (any other tag is left alone). Stops at the first record that fails (nothing
// of it stays mapped or taken; the error is thrown), when `from` holds nothing, and at the first
// record whose share has not all arrived while more is coming (`waiting`). Makes the device's
// context current.
struct ahead_result {
  std::size_t mapped = 0;  // bytes of the records mapped ahead
  bool waiting = false;    // stopped for memory still coming
};
ahead_result map_ahead(device& dev, tag& t, physical_source& from, std::size_t coming);

}  // namespace tagmem
