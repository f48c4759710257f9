// collective_state.hpp — what the steps of the NCCL pause and resume share, internal to
// integrations/nccl: the counts they keep for stats (guarded, like the records, by the record
// table's mutex), and the helpers that both directions use — the ranks' outcomes, a record's
// device and whole mapping, the copies between a record and its backup, and the checks of which
// process may claim which buffer (Note [matching shared allocations] in collective.cpp). The
// steps themselves are in pause_steps.hpp and resume_steps.hpp; collective.cpp runs them in
// order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "api/runtime.hpp"
#include "peers/group.hpp"
#include "peers/messages.hpp"
#include "records.hpp"

namespace tagmem::nccl::detail {

using peers::group_session;
using peers::rank_outcome;

// What the last pause released, by origin.
struct released_counts {
  std::size_t local_bytes = 0;
  std::size_t exported_bytes = 0;
  std::size_t imported_bytes = 0;
  std::uint64_t allocations = 0;
  std::size_t bytes() const noexcept { return local_bytes + exported_bytes + imported_bytes; }
};

// What the pauses and resumes of this process did, for stats() and tag_stats().
struct state {
  bool paused = false;
  std::uint64_t pause_count = 0;
  std::uint64_t resume_count = 0;
  released_counts last_released;
  std::size_t last_kept_bytes = 0;
  std::uint64_t last_kept_allocations = 0;
  std::uint64_t bytes_backed_up = 0;  // copied to the host by pauses, ever
  std::uint64_t bytes_restored = 0;   // copied back by resumes, ever
};
extern state g_state;  // guarded by records().mutex()

// ---- the ranks' outcomes -------------------------------------------------------------------

// This rank's part of a step, run: its failure (an error, or no host memory for the records) as
// the outcome to tell the other ranks.
template <class F>
rank_outcome attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const error& e) {
    return {e.code(), e.what()};
  } catch (const std::bad_alloc&) {
    return {TAGMEM_ERROR_HOST_OUT_OF_MEMORY, "out of host memory for the shim's records"};
  }
}

// Throws the first failure among the ranks: this rank's own with its code, another's as PEER
// (out-of-memory keeps its code, so the caller knows that freeing memory and retrying helps).
void throw_if_failed(const std::vector<rank_outcome>& all, int me, const char* step);

// Whether some rank failed.
bool any_failed(const std::vector<rank_outcome>& all);

// A hold on the runtime for a pause or resume. It is taken before the records' mutex, the order
// in which tagmem's own calls take them (the `nccl` tag's stats read the records under a hold).
// A failure is returned, to be reported to every rank in the operation's first step.
std::exception_ptr open_runtime(std::optional<runtime::hold>& rt);

// ---- records -------------------------------------------------------------------------------

// Whether `a` is this process's own (created or passed through here), not imported.
inline bool local(const allocation& a) { return a.from != origin::imported; }

// Local records live on their location; imports are worked with from their home device.
inline int device_of(const allocation& a) { return local(a) ? a.prop.location.id : a.home_device; }

// The device's primary context for the scope's life, when the device is known.
struct maybe_device_scope {
  maybe_device_scope(const runtime::hold& rt, int device) {
    if (device >= 0) scope.emplace(rt.dev(device).context());
  }
  std::optional<context_guard> scope;
};

// The mapping that covers all of `a`, or null.
const mapping_record* full_mapping(const allocation& a);

// `timeout_ms` as text, for messages.
std::string ms(int timeout_ms);

// ---- copies between a record and its backup ------------------------------------------------

// Waits for the copies queued on `dev`'s copy streams (copy_queue.hpp). Returns their status
// when they end in time; otherwise `if_late` runs once they have ended (it gives back what they
// use) and this throws TIMEOUT. Whatever the status, the copies have stopped when this returns:
// the memory they use may be given back.
CUresult wait_for_copies(device& dev, int timeout_ms, std::function<void()> if_late);

// The copies between `a`'s whole mapping and its backup extents.
meta_vector<backup_piece> pieces_of(const allocation& a, std::size_t piece_bytes);

// Gives back the backups of `list` and clears them off the records.
void give_back_backups(const std::vector<allocation*>& list);

// ---- who may claim what (Note [matching shared allocations]) -------------------------------

// Whether `p` is in `list`.
bool holds(const meta_vector<process_identity>& list, const process_identity& p);

// Whether the process that is now rank b.source_rank is the one `b` was imported from; else
// why not, naming both.
std::string owner_mismatch(const group_session& s, const allocation& b);

// Why `claimer` may not claim record `id` of this process, naming both; empty when it may.
std::string claim_refusal(const group_session& s, int claimer, std::uint64_t id,
                          const allocation* a);

}  // namespace tagmem::nccl::detail
