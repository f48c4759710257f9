// solo_offload.hpp — a replica's offload through the shared copy it kept, without meeting the
// other replicas.
//
// Note [offload alone]: the group offload of Note [replicated offload] needs every replica's call
// at about the same time; a controller that asks its workers one after the other would make the
// first wait for the second. Once a copy exists and this replica kept it at its last reload
// (Note [shared copy reuse]), its offload needs no meeting: the copy's header (shared_buffer.hpp)
// says what the others did. An offload alone:
//  1. reads the copy's latest offload C and its tag's digest (layout hash and sampled checksum at
//     offsets drawn from the copy's token and C). If it did not take part in C and another
//     replica did with the same digest, it joins C. Otherwise it starts C + 1: only when no live
//     replica still needs C (offloaded through it and not reloaded: its shares would be
//     overwritten; PEER naming it otherwise), publishing its digest at C + 1 first and moving C
//     on in the header with a compare-and-swap, so that two replicas starting at once make one
//     offload. A digest that differs from that of a replica that still needs C is
//     INVALID_ARGUMENT. Each refusal leaves the tag resident, untouched;
//  2. marks itself as needing that offload, checks it is still the latest (a replica starting
//     the next one at the same moment sees the mark, or this one sees the new offload and starts
//     over), copies its own share (unless another replica already wrote it for this offload) and
//     marks it written;
//  3. unmaps the mappings whose bytes all lie in written shares and returns. The others stay
//     mapped: they hold the bytes of shares other replicas have not written yet;
//  4. a waiter (a thread of the registry) unmaps each of those as the shares covering it are
//     written. A share whose replica has died, or that is still missing after
//     TAGMEM_REPLICA_TIMEOUT_MS, it copies itself from the mappings that still hold it, as the
//     group offload's step 4 does; so a replica that never comes costs the bound, not the bytes.
//     It takes the tag's lock only to unmap or copy, so that statistics and other calls on the
//     tag do not wait for the other replicas; a reload meanwhile ends it (the reload copies only
//     the written shares and keeps what is still mapped).
// The tag reads as offloaded (TAGMEM_OFFLOADED_BACKUP) from step 3; its mapped_bytes show what
// waits for the other replicas.
#pragma once

#include <atomic>
#include <cstdint>

#include "host/host_store.hpp"
#include "offload/transfer_plan.hpp"
#include "tags/tag.hpp"

namespace tagmem {

class shared_buffer;

// Whether the resident, replicated tag `t` (its lock held) can offload alone: a group of more than
// one, and it kept a shared copy of its run's size at its last reload.
bool can_offload_alone(tag& t) noexcept;

// Steps 1-3 of Note [offload alone] (the tag's lock held). Returns whether mappings wait for other
// replicas' shares (then run wait_for_shares). Throws INVALID_ARGUMENT, PEER, HOST_OUT_OF_MEMORY,
// DRIVER, the tag then resident with its bytes (or partial, the copy holding what was unmapped).
bool offload_alone(device& dev, tag& t, host_store& store, const config& cfg);

// Step 4, without the tag's lock held: returns once every mapping of this offload is unmapped,
// the tag was reloaded, or `stop` is set (the mappings left stay until the reload). Failures are
// logged; the mappings they concern stay mapped.
void wait_for_shares(device& dev, tag& t, host_store& store, const config& cfg, int timeout_ms,
                     const std::atomic<bool>& stop);

// Whether the run's bytes [lo, hi) lie only in resident mappings of `t`.
bool run_resident(tag& t, std::size_t lo, std::size_t hi) noexcept;

// The mappings of `t` whose bytes all lie in shares of `copy` that hold offload `generation`
// (`copy` must outlive the filter).
mapping_filter written_only(tag& t, const shared_buffer& copy, std::uint32_t generation);

// What a group offload (Note [replicated offload]) records in the copy for the replicas that
// offload alone later: this replica's digest for `generation`, that it needs it, and that it is
// the latest. Throws DRIVER (the sample's read).
void note_group_offload(device& dev, tag& t, shared_buffer& copy, int me, std::uint32_t generation);

}  // namespace tagmem
