// replica_tier.hpp — offloading a replicated tag to one host copy shared by its replicas, and
// reloading it from there.
//
// Note [replicated offload]: the replicas of a tag (replication.hpp) offload it together, each
// in its own process, as one group session (peers/group.hpp, bounded by
// TAGMEM_REPLICA_TIMEOUT_MS). Steps, each leaving every byte somewhere:
//  1. they meet and compare layouts and a sampled checksum (Note [replica check]); a mismatch
//     refuses the offload on every replica, tags untouched;
//  2. rank 0 makes the shared host copy (Note [shared host copy]) and sends its descriptor to
//     the others; every replica reports whether it holds it, and any failure stops all of them,
//     tags untouched;
//  3. each copies its share, the run's bytes [B·r/N, B·(r+1)/N), and marks it written in the
//     header, so each device moves 1/N of the bytes;
//  4. they wait for each other (one more exchange, bounded). Whatever share is then not marked
//     written (its replica died, failed or is late) the waiting replica copies itself: it still
//     holds every byte, so no share is ever lost to a replica that died mid-offload;
//  5. each unmaps its tag through the pipeline as DISCARD (the disk tier's way, Note [disk tier])
//     and keeps the shared copy with the tag. The memory of the shared copy goes once the last
//     replica holding it reloads, clears it or exits.
// Note [shared copy reuse]: a reload keeps the shared copy (not counted in the tag's host_bytes),
// as the host store keeps what it pinned, so that the next offload need not fault in and register
// the memory again: when every replica still holds the same copy (its header's random token, in
// step 1's exchange), they use it again. Shares are marked with the offload's generation, one
// more than the copy's last, so a share written by an earlier offload never passes for this one's.
// The copy goes at tagmem_host_trim, when the tag's replication is cleared or the tag goes, and
// when the replicas do not all hold it (a replica restarted).
// Once every replica kept the copy, later offloads go without meeting (Note [offload alone] in
// solo_offload.hpp); this one still records in the copy's header what those need. A replica that
// never comes makes the others' step 1 fail with TIMEOUT naming it, their tags resident, and a
// retry starts over. Reload needs no other replica: each copies the whole shared
// copy to its own device, after checking that every share is marked written or still mapped (a
// share that is neither is an error naming its rank, the tag left offloaded with the copy,
// retryable); it copies only the written shares.
#pragma once

#include "host/host_store.hpp"
#include "tags/tag.hpp"

namespace tagmem {

// Offloads the resident, whole, replicated tag `t` (its lock held) as Note [replicated offload]
// says. Throws INVALID_ARGUMENT (replicas differ), PEER, TIMEOUT, HOST_OUT_OF_MEMORY, DRIVER;
// the tag is then resident with its bytes, or partial with the shared copy holding them.
void offload_replicated(device& dev, tag& t, host_store& store, const config& cfg, int timeout_ms);

// Reloads a tag offloaded through its shared copy (its lock held). On failure the tag stays
// offloaded with the copy, retryable.
void reload_replicated(device& dev, tag& t, host_store& store, const config& cfg);

}  // namespace tagmem
