// collective.cpp — the collective pause and resume of NCCL's memory: the protocol, pause() and
// resume() running its steps in order, and the `nccl` tag's stats.
//
// Pause, on every rank at once:
//  1. join the group; wait for this process's devices to go idle, within the timeout
//     (bounded_wait.hpp); all ranks confirm (a peer's kernels write into our buffers, so nobody
//     copies before every device is idle);
//  2. match shared allocations (Note [matching shared allocations]);
//  3. decide, for every allocation, whether it can be released (Note [what stays resident]);
//  4. copy the bytes of the allocations this process created to pinned host memory; all ranks
//     confirm — a failure anywhere so far leaves every rank as it was;
//  5. unmap and release: the allocations created here and the ones imported from peers, in two
//     phases (Note [two-phase release]). The memory goes back to the driver when the last
//     process lets go of it, which is the point of doing this together.
// Resume:
//  1. join; rebuild every released allocation created here — cuMemCreate with the recorded
//     properties, map at each recorded address, set the recorded access, copy the bytes back;
//     all ranks confirm, and if any failed (out of memory, say) all undo what they rebuilt and
//     stay paused with their backups;
//  2. each importer says which allocations it needs; each exporter exports new POSIX fds for
//     them and mails them; importers import and map them at their old addresses with their old
//     access; all ranks confirm.
//
// Note [matching shared allocations]: NCCL passes fds between processes itself, so the shim
// does not know which of a process's imports came from which peer's allocation. It keeps a
// duplicate of each fd an allocation is exported as, and of each fd imported. During a pause
// every importer mails the duplicates of its unmatched imports to every other rank, and each
// owner compares them with its exports that no process was found holding yet (fd_identity.hpp:
// the same open file description). The owner establishes the match itself: the fd came, through
// the group's connections whose processes the kernel names, from the process that is that rank,
// so holding a duplicate of the exported fd proves the buffer was shared with that process. A
// claimer's word counts for nothing. The owner answers that importer alone with its record id
// and a duplicate of its export, which the importer checks is the file it imported; an owner
// mails its exports to nobody else. A match gives the importer the allocation's owner for good
// — its rank, its record id and its process (process_identity.hpp) — and gives the owner the
// importer's process. Later pauses need no matching for it, and the importer's duplicate is
// closed. Exports are never re-matched after a resume: the new fds go straight to the ranks known
// to need them. (An importer's duplicate reaches every rank of the group, as its owner is not
// known yet; a rank that kept one can present it later only for an export no process was found
// holding, and its owner then serves it as a process that holds the buffer, which it does.)

// From then on the processes are checked, not the ranks: an importer claims a buffer only if
// the process that is now rank `source_rank` is the one it imported from, and an owner accepts
// a claim, or re-exports on resume, only for a process it exported that buffer to. Anything
// else — a process of another job in the group, a rank taken by a different process, a forged
// claim — fails the pause or resume on every rank with a message naming both processes, before
// anything is released or mapped. An owner also keeps a buffer resident while a process it was
// shared with is not in the group.
//
// Note [what stays resident]: releasing an allocation that a process outside the group maps
// would leave that process on the old memory while this one moves to new memory after resume:
// silent corruption. So an allocation is released only if every fd it was exported as was
// matched to an import inside the group, every importer can release its side, it was never
// exported as another kind of handle (fabric), it is not bound to a multicast object (NVLS) nor
// exported as a dma-buf (what a NIC registers for GPUDirect RDMA), and — for one created here —
// some mapping covers all of it (so its bytes can be copied). Everything else stays mapped and is
// counted in last_kept_bytes. An import whose owner is unknown stays mapped too.
//
// Note [two-phase release]: an unmap can fail half-way through an allocation's mappings, and
// the processes sharing an allocation must end up on the same memory. So every rank first
// detaches what it releases (record_moves.hpp: unmapped, but with a driver reference that keeps
// the memory and its bytes), and all ranks confirm. If any rank failed to detach anything, every
// rank maps everything back where it was and drops the backups: the pause fails leaving every
// rank as it was, and can simply be repeated. Only when all ranks detached everything do they
// drop their references. Should mapping back fail as well (a second failure), that allocation
// is released instead, with its backup, and the ranks agree to count themselves paused so that
// a resume rebuilds it.
//
// The steps are in pause_steps.hpp and resume_steps.hpp, what they share (the counts stats()
// reports, the ranks' outcomes, the checks of who may claim what) in collective_state.hpp.
#include "collective.hpp"

#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/runtime.hpp"
#include "backup_extents.hpp"
#include "bounded_wait.hpp"
#include "collective_state.hpp"
#include "interposed.hpp"
#include "pause_steps.hpp"
#include "peers/group.hpp"
#include "peers/messages.hpp"
#include "record_moves.hpp"
#include "records.hpp"
#include "resume_steps.hpp"

namespace tagmem::nccl {

using namespace peers;   // the group session, its messages and descriptor passing
using namespace detail;  // the steps and what they share

void pause(const group_spec& spec) {
  std::optional<runtime::hold> rt;
  std::exception_ptr no_runtime = open_runtime(rt);
  std::lock_guard lock(records().mutex());
  drop_leftovers();
  auto s = group_session::join(spec, group_op::pause, !g_state.paused, TAGMEM_ERROR_TAG_OFFLOADED,
                               "the nccl tag is already paused (resume it first)");
  const int me = s->rank();
  throw_if_failed(s->outcomes(attempt([&] {
                                if (no_runtime) std::rethrow_exception(no_runtime);
                                synchronize_devices(*rt, spec.timeout_ms);
                              }),
                              "waiting for the devices to be idle"),
                  me, "waiting for its devices to be idle");
  match(*s);
  std::set<std::uint64_t> release = decide(*s);
  std::vector<rank_outcome> copied;
  try {
    copied = s->outcomes(attempt([&] { back_up(*rt, release, spec.timeout_ms); }),
                         "copying bytes to the host");
  } catch (...) {
    forget_backups(release);  // a rank vanished: nothing was released anywhere
    throw;
  }
  if (any_failed(copied)) {
    forget_backups(release);  // nothing was released anywhere: every rank stays as it was
    throw_if_failed(copied, me, "copying NCCL's bytes to the host");
  }
  // Note [two-phase release]
  std::vector<detached> off;
  rank_outcome mine = attempt([&] { detach_all(*rt, release, off); });
  std::vector<rank_outcome> unmapped;
  std::string failures;
  try {
    unmapped = s->outcomes(mine, "unmapping");
  } catch (...) {
    bool whole = put_back(*rt, off, failures);  // a rank vanished: the others put theirs back too
    forget_backups(release);
    if (!whole) {
      g_state.paused = true;
      g_state.pause_count++;
      count_released(release);
      count_kept();
    }
    throw;
  }
  if (any_failed(unmapped)) {
    bool whole = put_back(*rt, off, failures);
    forget_backups(release);
    bool all_whole = whole;
    try {
      all_whole = !any_failed(s->outcomes(
          whole ? rank_outcome{} : rank_outcome{TAGMEM_ERROR_DRIVER, failures}, "mapping back"));
    } catch (const error&) {
      // A rank vanished: this one's own result is all it knows.
    }
    if (!all_whole) {  // a resume rebuilds what some rank could not map back
      g_state.paused = true;
      g_state.pause_count++;
      count_released(release);
      count_kept();
    }
    throw_if_failed(unmapped, me, "unmapping NCCL's buffers (every rank mapped them back)");
  }
  for (const detached& d : off) finish_release(d);
  g_state.paused = true;
  g_state.pause_count++;
  count_released(release);
  count_kept();
}

void resume(const group_spec& spec) {
  std::optional<runtime::hold> rt;
  std::exception_ptr no_runtime = open_runtime(rt);
  std::lock_guard lock(records().mutex());
  drop_leftovers();
  auto s = group_session::join(spec, group_op::resume, g_state.paused, TAGMEM_ERROR_TAG_RESIDENT,
                               "the nccl tag is not paused; nothing to resume");
  const int me = s->rank();
  std::vector<rebuilt> done;
  rank_outcome mine = attempt([&] {
    if (no_runtime) std::rethrow_exception(no_runtime);
    done = rebuild_local(*rt, spec.timeout_ms);
  });
  std::vector<rank_outcome> all;
  try {
    all = s->outcomes(mine, "rebuilding buffers");
  } catch (...) {
    undo(*rt, done);  // a rank vanished: stay paused with the backup
    throw;
  }
  if (any_failed(all)) {
    undo(*rt, done);  // every rank stays paused with its backup, so the call can be repeated
    throw_if_failed(all, me, "rebuilding NCCL's buffers");
  }
  commit(done);
  mine = attempt([&] { reshare(*rt, *s); });
  all = s->outcomes(mine, "re-sharing");
  throw_if_failed(all, me, "re-sharing NCCL's buffers");
  g_state.paused = false;
  g_state.resume_count++;
}

tagmem_nccl_stats stats() {
  std::lock_guard lock(records().mutex());
  tagmem_nccl_stats st{};
  records().for_each([&](allocation& a) {
    st.held_bytes += a.size;
    st.allocations++;
    (a.released ? st.released_bytes : st.resident_bytes) += a.size;
    for (const host_extent& e : a.backup) st.backup_bytes += e.size;
    if (a.from == origin::imported) {
      st.imported_bytes += a.size;
      st.imported_allocations++;
    } else if (a.exported_ever) {
      st.exported_bytes += a.size;
      st.exported_allocations++;
    } else {
      st.local_bytes += a.size;
      st.local_allocations++;
    }
    if (a.from == origin::classic) st.classic_bytes += a.size;
  });
  st.host_located_bytes = counters().host_located_bytes.load();
  st.passthrough_bytes = counters().classic_bytes_now.load();
  st.last_released_local_bytes = g_state.last_released.local_bytes;
  st.last_released_exported_bytes = g_state.last_released.exported_bytes;
  st.last_released_imported_bytes = g_state.last_released.imported_bytes;
  st.last_released_bytes = g_state.last_released.bytes();
  st.last_released_allocations = g_state.last_released.allocations;
  st.last_kept_bytes = g_state.last_kept_bytes;
  st.last_kept_allocations = g_state.last_kept_allocations;
  st.pause_count = g_state.pause_count;
  st.resume_count = g_state.resume_count;
  st.paused = g_state.paused ? 1 : 0;
  st.backup_store_used_bytes = backup_bytes_out();
  return st;
}

bool holds_memory_on(int device) {
  std::lock_guard lock(records().mutex());
  bool found = false;
  records().for_each([&](allocation& a) { found = found || device_of(a) == device; });
  return found;
}

// Every record counts as one allocation in one mapping of its size; the counts "ever" are the
// process's pauses and resumes, whichever devices they moved.
tagmem_tag_stats tag_stats(int device) {
  std::lock_guard lock(records().mutex());
  tagmem_tag_stats t{};
  t.state = g_state.paused ? TAGMEM_OFFLOADED_BACKUP : TAGMEM_RESIDENT;
  records().for_each([&](allocation& a) {
    if (device_of(a) != device) return;
    t.allocated_bytes += a.size;
    t.requested_bytes += a.size;
    t.reserved_bytes += a.size;
    t.virtual_bytes += a.size;
    if (!a.released) t.mapped_bytes += a.size;
    for (const host_extent& e : a.backup) t.host_bytes += e.size;
    t.live_allocations++;
    t.mappings++;
  });
  t.offload_count = g_state.pause_count;
  t.reload_count = g_state.resume_count;
  t.bytes_offloaded = g_state.bytes_backed_up;
  t.bytes_reloaded = g_state.bytes_restored;
  return t;
}

std::string keeps_runtime() {
  if (std::size_t out = backup_bytes_out())
    return "NCCL's paused memory has " + std::to_string(out) +
           " bytes of backups in tagmem's host store; call tagmem_nccl_resume first";
  if (late_wait_running())
    return "copies of an NCCL pause or resume that timed out are still running; wait for them "
           "to end (the next tagmem_nccl_pause or tagmem_nccl_resume waits for them)";
  return {};
}

}  // namespace tagmem::nccl
