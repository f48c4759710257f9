// collective.cpp — the steps of a collective pause and resume of NCCL's memory.
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
// every exporter mails its duplicates to every other rank, and each importer compares them with
// its own (fd_identity.hpp: the same open file description). A match gives the importer the
// allocation's owner for good — its rank, its record id and its process (process_identity.hpp)
// — and gives the owner the importer's process: holding a duplicate of the exported fd is the
// proof that the buffer was shared with that process. Later pauses need no matching for it,
// and the importer's duplicate is closed. Exports are never re-matched after a resume: the new
// fds go straight to the ranks known to need them.
//
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
#include "collective.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "api/runtime.hpp"
#include "backup_extents.hpp"
#include "bounded_wait.hpp"
#include "collective_messages.hpp"
#include "interposed.hpp"
#include "peers/fd_identity.hpp"
#include "peers/messages.hpp"
#include "record_moves.hpp"
#include "records.hpp"

namespace tagmem::nccl {

using namespace peers;  // the group session, its messages and descriptor passing

namespace {

// What the last pause released, by origin.
struct released_counts {
  std::size_t local_bytes = 0;
  std::size_t exported_bytes = 0;
  std::size_t imported_bytes = 0;
  std::uint64_t allocations = 0;
  std::size_t bytes() const noexcept { return local_bytes + exported_bytes + imported_bytes; }
};

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
state g_state;  // guarded by records().mutex()

// ---- small helpers -------------------------------------------------------------------------

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
void throw_if_failed(const std::vector<rank_outcome>& all, int me, const char* step) {
  if (all[me].status != TAGMEM_SUCCESS) fail(all[me].status, all[me].message);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].status == TAGMEM_SUCCESS) continue;
    tagmem_status code = all[r].status == TAGMEM_ERROR_OUT_OF_MEMORY ||
                                 all[r].status == TAGMEM_ERROR_HOST_OUT_OF_MEMORY
                             ? all[r].status
                             : TAGMEM_ERROR_PEER;
    fail(code, "rank " + std::to_string(r) + " failed while " + step + ": " + all[r].message);
  }
}

bool local(const allocation& a) { return a.from != origin::imported; }

// Local records live on their location; imports are worked with from their home device.
int device_of(const allocation& a) { return local(a) ? a.prop.location.id : a.home_device; }

// The device's primary context for the scope's life, when the device is known.
struct maybe_device_scope {
  maybe_device_scope(const runtime::hold& rt, int device) {
    if (device >= 0) scope.emplace(rt.dev(device).context());
  }
  std::optional<context_guard> scope;
};

const mapping_record* full_mapping(const allocation& a) {
  for (const mapping_record& m : a.mappings)
    if (m.offset == 0 && m.size == a.size) return &m;
  return nullptr;
}

// Whether this process's side of `a` allows a release (Note [what stays resident]).
bool releasable_here(const allocation& a) {
  if (a.released || a.foreign_export || a.multicast || a.dma_buf) return false;
  if (a.from == origin::imported) return a.source_rank >= 0;
  return full_mapping(a) != nullptr;
}

std::size_t& origin_slot(released_counts& c, const allocation& a) {
  if (a.from == origin::imported) return c.imported_bytes;
  return a.exported_ever ? c.exported_bytes : c.local_bytes;
}

bool any_failed(const std::vector<rank_outcome>& all) {
  return std::any_of(all.begin(), all.end(),
                     [](const rank_outcome& o) { return o.status != TAGMEM_SUCCESS; });
}

std::string ms(int timeout_ms) { return std::to_string(timeout_ms) + " ms"; }

// Work left over from an earlier call that timed out must end before this one touches a device.
void settle_earlier_waits(deadline until, int timeout_ms) {
  int busy = -1;
  if (!settle_late_waits(until, &busy))
    fail(TAGMEM_ERROR_TIMEOUT, "device " + std::to_string(busy) +
                                   " is still busy with work that outlived an earlier timeout "
                                   "(waited " +
                                   ms(timeout_ms) + ")");
}

// Waits for every device with a record to be idle, each wait bounded (bounded_wait.hpp).
void synchronize_devices(const runtime::hold& rt, int timeout_ms) {
  std::set<int> devices;
  records().for_each([&](allocation& a) {
    if (device_of(a) >= 0) devices.insert(device_of(a));
  });
  deadline until = deadline_after(timeout_ms);
  settle_earlier_waits(until, timeout_ms);
  for (int d : devices) {
    CUcontext context = rt.dev(d).context();
    wait_outcome w = wait_bounded(
        d, context, until, [context] { return driver::api().cuCtxSynchronize(context); }, {});
    if (!w.in_time)
      fail(TAGMEM_ERROR_TIMEOUT, "device " + std::to_string(d) +
                                     " did not finish its work within " + ms(timeout_ms) +
                                     " (a kernel waiting for a peer that is gone?); nothing was "
                                     "copied or released");
    driver::check(w.status, "cuCtxSynchronize");
  }
}

// Waits for the copies queued on `dev`'s copy streams (copy_queue.hpp). Returns their status
// when they end in time; otherwise `if_late` runs once they have ended (it gives back what they
// use) and this throws TIMEOUT. Whatever the status, the copies have stopped when this returns:
// the memory they use may be given back.
CUresult wait_for_copies(device& dev, int timeout_ms, std::function<void()> if_late) {
  wait_outcome w = wait_bounded(
      dev.ordinal(), dev.context(), deadline_after(timeout_ms),
      [&dev] { return dev.wait_copy_streams(); }, std::move(if_late));
  if (!w.in_time)
    fail(TAGMEM_ERROR_TIMEOUT, "copies on device " + std::to_string(dev.ordinal()) +
                                   " did not finish within " + ms(timeout_ms));
  return w.status;
}

// The copies between `a`'s whole mapping and its backup extents.
meta_vector<backup_piece> pieces_of(const allocation& a, std::size_t piece_bytes) {
  meta_vector<backup_piece> out;
  extent_cursor cursor{a.backup};
  CUdeviceptr va = full_mapping(a)->va;
  cut_pieces(va, va + a.size, cursor, piece_bytes, out);
  return out;
}

// A hold on the runtime for a pause or resume. It is taken before the records' mutex, the order
// in which tagmem's own calls take them (the `nccl` tag's stats read the records under a hold).
// A failure is returned, to be reported to every rank in the operation's first step.
std::exception_ptr open_runtime(std::optional<runtime::hold>& rt) {
  try {
    rt.emplace();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

// ---- pause ---------------------------------------------------------------------------------

// Step 2: exporters mail their fd duplicates; importers compare.
void match(group_session& s) {
  std::vector<letter> outbox;
  records().for_each([&](allocation& a) {
    if (!local(a) || a.released || a.exports.empty()) return;
    for (std::size_t first = 0; first < a.exports.size(); first += kMaxFds) {
      std::size_t n = std::min(kMaxFds, a.exports.size() - first);
      letter l;
      l.blob = encode_export_letter({a.id, static_cast<std::uint32_t>(first)});
      for (std::size_t i = 0; i < n; ++i) l.fds.push_back(a.exports[first + i].fd);
      for (int r = 0; r < s.size(); ++r) {
        if (r == s.rank()) continue;
        l.to = r;
        outbox.push_back(l);
      }
    }
  });
  // Per import, the exporter's (rank, id, process) and the indices of its fds it matched in
  // this pause.
  s.mail(
      outbox,
      [&](int from, const std::string& blob, owned_fds& fds) {
        export_letter l =
            decode_from(s.describe(from), "matching", [&] { return decode_export_letter(blob); });
        records().for_each([&](allocation& b) {
          if (b.from != origin::imported || b.import_fd < 0) return;
          for (std::size_t i = 0; i < fds.size(); ++i) {
            if (!same_open_file(b.import_fd, fds[i])) continue;
            b.source_rank = from;
            b.source_id = l.id;
            b.source_process = s.member(from);
            b.matched_indices.push_back(l.first + static_cast<std::uint32_t>(i));
          }
        });
      },
      "matching the buffers shared between ranks");
  records().for_each([&](allocation& b) {
    if (b.from == origin::imported && b.source_rank >= 0 && b.import_fd >= 0) {
      close_quietly(b.import_fd);  // matched for good
      b.import_fd = -1;
    }
  });
}

bool holds(const meta_vector<process_identity>& list, const process_identity& p) {
  return std::any_of(list.begin(), list.end(),
                     [&](const process_identity& q) { return q.same_as(p); });
}

// Whether the process that is now rank b.source_rank is the one `b` was imported from; else
// why not, naming both.
std::string owner_mismatch(const group_session& s, const allocation& b) {
  if (b.source_rank < s.size() && b.source_process.same_as(s.member(b.source_rank))) return {};
  std::string now = b.source_rank < s.size()
                        ? s.describe(b.source_rank) + " is " + s.member(b.source_rank).describe()
                        : "the group has no rank " + std::to_string(b.source_rank);
  return s.describe(s.rank()) + " maps buffer " + std::to_string(b.source_id) + " of " +
         b.source_process.describe() + " (rank " + std::to_string(b.source_rank) +
         " when it was matched), but " + now + ": not the process it was shared with";
}

// Why `claimer` may not claim record `id` of this process, naming both; empty when it may.
std::string claim_refusal(const group_session& s, int claimer, std::uint64_t id,
                          const allocation* a) {
  std::string both =
      s.describe(claimer) + " claims buffer " + std::to_string(id) + " of " + s.describe(s.rank());
  if (!a || !local(*a)) return both + ", which has no such buffer";
  if (holds(a->importers, s.member(claimer))) return {};
  std::string to;
  for (const process_identity& p : a->importers) to += (to.empty() ? "" : ", ") + p.describe();
  return both + ", which was never exported to it (it went to " + (to.empty() ? "no one" : to) +
         ")";
}

// Step 3: importers claim what they map; exporters decide; importers follow. Returns the ids
// of the records this process releases. An owner serves only the processes it exported to, an
// importer only the process it imported from; any other claim fails the pause on every rank,
// naming both sides, before anything is copied or released.
std::set<std::uint64_t> decide(group_session& s) {
  std::vector<claim> mine;
  std::string problems;
  auto problem = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  records().for_each([&](allocation& b) {
    if (b.from != origin::imported || b.released || b.source_rank < 0) return;
    std::string mismatch = owner_mismatch(s, b);
    if (!mismatch.empty()) {
      problem(mismatch);
    } else {
      mine.push_back(
          {b.source_rank, b.source_id, releasable_here(b),
           std::vector<std::uint32_t>(b.matched_indices.begin(), b.matched_indices.end())});
    }
    b.matched_indices.clear();
  });
  std::vector<std::string> all =
      s.all_gather(encode_claims(mine), "telling owners who maps their buffers");
  std::map<std::uint64_t, bool> importers_agree;  // my record id -> every claimer can release
  for (int rank = 0; rank < s.size(); ++rank) {
    for (const claim& c : decode_from(s.describe(rank), "claiming buffers",
                                      [&] { return decode_claims(all[rank]); })) {
      if (c.owner != s.rank()) continue;
      allocation* a = records().by_id(c.id);
      if (a && local(*a)) {
        for (std::uint32_t index : c.matched) {  // found in this pause: it holds that fd
          if (index >= a->exports.size()) continue;
          a->exports[index].matched = true;
          if (!holds(a->importers, s.member(rank))) a->importers.push_back(s.member(rank));
        }
      }
      if (std::string refusal = claim_refusal(s, rank, c.id, a); !refusal.empty()) {
        problem(refusal);
        continue;
      }
      auto [it, inserted] = importers_agree.emplace(c.id, c.can_release);
      if (!inserted) it->second = it->second && c.can_release;
    }
  }
  throw_if_failed(
      s.outcomes(problems.empty() ? rank_outcome{} : rank_outcome{TAGMEM_ERROR_PEER, problems},
                 "checking who maps what"),
      s.rank(), "checking who maps its buffers");
  std::set<std::uint64_t> release;
  std::vector<decision> decisions;
  records().for_each([&](allocation& a) {
    if (!local(a) || a.released) return;
    bool ok = releasable_here(a);
    for (const export_record& e : a.exports) ok = ok && e.matched;
    // Every process it was shared with must be here to let go of it (one outside the group
    // would keep the old memory): it claims it, or it is a member that no longer maps it.
    for (const process_identity& p : a.importers) {
      bool here = false;
      for (int r = 0; r < s.size(); ++r) here = here || s.member(r).same_as(p);
      ok = ok && here;
    }
    if (auto it = importers_agree.find(a.id); it != importers_agree.end()) ok = ok && it->second;
    if (ok) release.insert(a.id);
    if (importers_agree.count(a.id)) decisions.push_back({a.id, ok});
  });
  all = s.all_gather(encode_decisions(decisions), "agreeing on what to release");
  std::map<std::pair<int, std::uint64_t>, bool> owner_says;
  for (int rank = 0; rank < s.size(); ++rank) {
    for (const decision& d :
         decode_from(s.describe(rank), "deciding", [&] { return decode_decisions(all[rank]); }))
      owner_says[{rank, d.id}] = d.release;
  }
  records().for_each([&](allocation& b) {
    if (b.from != origin::imported || !releasable_here(b)) return;
    if (!owner_mismatch(s, b).empty()) return;
    auto it = owner_says.find({b.source_rank, b.source_id});
    if (it != owner_says.end() && it->second) release.insert(b.id);
  });
  return release;
}

void give_back_backups(const std::vector<allocation*>& list) {
  for (allocation* a : list) {
    return_backup(a->backup);
    a->backup.clear();
  }
}

// Copies the bytes of `list` (records on `device`) to pinned host memory. On failure every
// backup is off the records: given back, or — while copies may still write into it — handed to
// the late wait, which gives it back once they have ended.
void back_up_device(const runtime::hold& rt, int device, const std::vector<allocation*>& list,
                    int timeout_ms) {
  host_store& store = rt.store();
  tagmem::device& dev = rt.dev(device);
  context_guard scope(dev.context());
  std::vector<allocation*> queued;
  std::exception_ptr failed;
  {
    copy_queue copies(dev);
    try {
      queued.reserve(list.size());
      for (allocation* a : list) {
        a->backup = take_backup(store, a->size);
        queued.push_back(a);
        for (const backup_piece& p : pieces_of(*a, rt.settings().copy_piece_bytes))
          copies.to_host(p, TAGMEM_NCCL_TAG);
      }
    } catch (...) {
      failed = std::current_exception();
    }
  }
  auto in_flight = std::make_shared<meta_vector<host_extent>>();
  for (allocation* a : queued)
    in_flight->insert(in_flight->end(), a->backup.begin(), a->backup.end());
  CUresult status = CUDA_SUCCESS;
  try {
    status = wait_for_copies(dev, timeout_ms, [in_flight] { return_backup(*in_flight); });
  } catch (...) {
    for (allocation* a : queued) a->backup.clear();  // the late wait gives them back
    throw;
  }
  if (failed || status != CUDA_SUCCESS) {
    give_back_backups(queued);
    if (failed) std::rethrow_exception(failed);
    driver::check(status, "cuStreamSynchronize");
  }
}

// Step 4: copies the bytes of the local records in `release` to pinned host memory.
void back_up(const runtime::hold& rt, const std::set<std::uint64_t>& release, int timeout_ms) {
  std::map<int, std::vector<allocation*>> by_device;
  for (std::uint64_t id : release) {
    allocation* a = records().by_id(id);
    if (local(*a)) by_device[device_of(*a)].push_back(a);
  }
  std::vector<allocation*> done;
  try {
    for (auto& [device, list] : by_device) {
      back_up_device(rt, device, list, timeout_ms);
      done.insert(done.end(), list.begin(), list.end());
    }
  } catch (...) {
    give_back_backups(done);
    throw;
  }
}

// Gives back the backups of the records in `release` that are resident.
void forget_backups(const std::set<std::uint64_t>& release) {
  for (std::uint64_t id : release) {
    allocation* a = records().by_id(id);
    if (a && !a->released && !a->backup.empty()) give_back_backups({a});
  }
}

// Step 5, first phase (Note [two-phase release]): detaches every record in `release`, in
// `off`. Stops at the first failure (that record is as it was).
void detach_all(const runtime::hold& rt, const std::set<std::uint64_t>& release,
                std::vector<detached>& off) {
  off.reserve(release.size());
  for (std::uint64_t id : release) {
    allocation* a = records().by_id(id);
    maybe_device_scope scope(rt, device_of(*a));
    off.push_back(detach(*a));
  }
}

// Maps every detached record back. One that cannot be is released instead (it keeps its
// backup); returns false then, with the reasons in `failures`.
bool put_back(const runtime::hold& rt, std::vector<detached>& off, std::string& failures) {
  bool whole = true;
  for (const detached& d : off) {
    try {
      maybe_device_scope scope(rt, device_of(*d.a));
      reattach(d);
      end_borrow(d);
    } catch (const error& e) {
      whole = false;
      failures +=
          std::string(" ") + e.what() + ": buffer " + std::to_string(d.a->id) + " stays released;";
      finish_release(d);
    }
  }
  off.clear();
  return whole;
}

// The last pause's released bytes, by origin.
void count_released(const std::set<std::uint64_t>& release) {
  released_counts fresh;
  for (std::uint64_t id : release) {
    allocation* a = records().by_id(id);
    if (!a || !a->released) continue;
    origin_slot(fresh, *a) += a->size;
    fresh.allocations++;
    for (const host_extent& e : a->backup) g_state.bytes_backed_up += e.size;
  }
  g_state.last_released = fresh;
}

void count_kept() {
  g_state.last_kept_bytes = 0;
  g_state.last_kept_allocations = 0;
  records().for_each([&](allocation& a) {
    if (a.released) return;
    g_state.last_kept_bytes += a.size;
    g_state.last_kept_allocations++;
  });
}

// ---- resume --------------------------------------------------------------------------------

struct rebuilt {
  allocation* a;
  CUmemGenericAllocationHandle handle;
  bool mapped;  // at every recorded mapping of a
};

// What undoing a rebuild takes, copied out of the records so that a late wait can do it.
struct unbuild {
  CUmemGenericAllocationHandle handle = 0;
  std::vector<std::pair<CUdeviceptr, std::size_t>> mappings;  // empty when not mapped
};

std::vector<unbuild> to_unbuild(const std::vector<rebuilt>& done) {
  std::vector<unbuild> out;
  for (const rebuilt& r : done) {
    unbuild u{r.handle, {}};
    if (r.mapped)
      for (const mapping_record& m : r.a->mappings) u.mappings.emplace_back(m.va, m.size);
    out.push_back(std::move(u));
  }
  return out;
}

void run_unbuild(const std::vector<unbuild>& list) {
  for (const unbuild& u : list) {
    for (auto [va, size] : u.mappings) driver::api().cuMemUnmap(va, size);
    driver::api().cuMemRelease(u.handle);
  }
}

// Rebuilds and refills the released local records of one device, in `out`. On failure, what it
// rebuilt is undone: now, or — while copies may still fill it — by the late wait once they end.
void rebuild_device(const runtime::hold& rt, int device, const std::vector<allocation*>& list,
                    int timeout_ms, std::vector<rebuilt>& out) {
  if (!settle_late_wait(device, deadline_after(timeout_ms)))
    fail(TAGMEM_ERROR_TIMEOUT, "device " + std::to_string(device) +
                                   " is still busy with work that outlived an earlier timeout "
                                   "(waited " +
                                   ms(timeout_ms) + ")");
  tagmem::device& dev = rt.dev(device);
  context_guard scope(dev.context());
  std::vector<rebuilt> here;
  std::exception_ptr failed;
  {
    copy_queue copies(dev);
    try {
      here.reserve(list.size());
      for (allocation* a : list) {
        CUmemGenericAllocationHandle h = 0;
        TAGMEM_CU(cuMemCreate, &h, a->size, &a->prop, 0);
        here.push_back({a, h, false});
        map_everywhere(*a, h);
        here.back().mapped = true;
        for (const backup_piece& p : pieces_of(*a, rt.settings().copy_piece_bytes))
          copies.to_device(p, TAGMEM_NCCL_TAG);
      }
    } catch (...) {
      failed = std::current_exception();
    }
  }
  auto pending = std::make_shared<std::vector<unbuild>>(to_unbuild(here));
  CUresult status = wait_for_copies(dev, timeout_ms, [pending] { run_unbuild(*pending); });
  if (failed || status != CUDA_SUCCESS) {
    run_unbuild(*pending);
    if (failed) std::rethrow_exception(failed);
    driver::check(status, "cuStreamSynchronize");
  }
  out.insert(out.end(), here.begin(), here.end());
}

void undo(const runtime::hold& rt, std::vector<rebuilt>& done) {
  for (const rebuilt& r : done) {
    try {
      context_guard scope(rt.dev(device_of(*r.a)).context());
      run_unbuild(to_unbuild({r}));
    } catch (const error&) {
      run_unbuild(to_unbuild({r}));  // the calls need no context of their own
    }
  }
  done.clear();
}

// Resume step 1 for this rank: rebuilds and refills; on failure undoes everything it did.
std::vector<rebuilt> rebuild_local(const runtime::hold& rt, int timeout_ms) {
  std::vector<rebuilt> out;
  std::map<int, std::vector<allocation*>> by_device;
  records().for_each([&](allocation& a) {
    if (local(a) && a.released) by_device[device_of(a)].push_back(&a);
  });
  try {
    for (auto& [device, list] : by_device) rebuild_device(rt, device, list, timeout_ms, out);
  } catch (...) {
    undo(rt, out);
    throw;
  }
  return out;
}

void commit(std::vector<rebuilt>& done) {
  for (rebuilt& r : done) {
    allocation& a = *r.a;
    a.real = r.handle;
    a.real_held = true;
    if (a.from == origin::created && a.app_refs == 0) {  // NCCL had let go of its handle
      release_or_keep(r.handle);
      a.real_held = false;
    }
    a.released = false;
    for (const host_extent& e : a.backup) g_state.bytes_restored += e.size;
    give_back_backups({&a});
  }
}

// Resume step 2: re-share. An owner hands a new handle only to a process it exported the
// buffer to, an importer takes one only from the process it imported from; a mismatch fails
// the resume naming both sides, and nothing is mapped for it.
void reshare(const runtime::hold& rt, group_session& s) {
  std::vector<need> needs;
  std::string failures;
  tagmem_status code = TAGMEM_ERROR_DRIVER;  // PEER once a process was not the right one
  records().for_each([&](allocation& b) {
    if (b.from != origin::imported || !b.released) return;
    if (std::string mismatch = owner_mismatch(s, b); !mismatch.empty()) {
      failures += " " + mismatch + ";";
      code = TAGMEM_ERROR_PEER;
    } else {
      needs.push_back({b.source_rank, b.source_id});
    }
  });
  std::vector<std::string> all = s.all_gather(encode_needs(needs), "asking owners for new handles");
  std::vector<letter> outbox;
  std::vector<int> exported;
  for (int rank = 0; rank < s.size(); ++rank) {
    std::set<std::uint64_t> sent;
    for (const need& n : decode_from(s.describe(rank), "asking for handles",
                                     [&] { return decode_needs(all[rank]); })) {
      if (n.owner != s.rank() || !sent.insert(n.id).second) continue;
      allocation* a = records().by_id(n.id);
      int fd = -1;
      CUresult res = CUDA_ERROR_INVALID_VALUE;
      std::string refusal = claim_refusal(s, rank, n.id, a);
      if (refusal.empty() && !a->released && !a->mappings.empty()) {
        // NCCL may hold no handle of its own (then neither does the shim): borrow one.
        CUmemGenericAllocationHandle h = a->real;
        bool borrowed = !a->real_held;
        if (borrowed) {
          res = driver::api().cuMemRetainAllocationHandle(
              &h, reinterpret_cast<void*>(a->mappings.front().va));
        }
        if (!borrowed || res == CUDA_SUCCESS) {
          res = driver::api().cuMemExportToShareableHandle(
              &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
          if (borrowed) release_or_keep(h);
        }
      }
      letter l;
      l.to = rank;
      l.blob = encode_handle_letter({n.id, res == CUDA_SUCCESS});
      if (res == CUDA_SUCCESS) {
        l.fds.push_back(fd);
        exported.push_back(fd);
      } else if (!refusal.empty()) {
        failures += " " + refusal + ";";
        code = TAGMEM_ERROR_PEER;
      } else {
        failures += " cannot export buffer " + std::to_string(n.id) + " for rank " +
                    std::to_string(rank) + ";";
      }
      outbox.push_back(std::move(l));
    }
  }
  auto on_letter = [&](int from, const std::string& blob, owned_fds& fds) {
    handle_letter l = decode_from(s.describe(from), "handing out handles",
                                  [&] { return decode_handle_letter(blob); });
    bool ok = l.ok && fds.size() == 1;
    records().for_each([&](allocation& b) {
      if (b.from != origin::imported || !b.released || b.source_rank != from ||
          b.source_id != l.id || !owner_mismatch(s, b).empty())
        return;
      if (!ok) {
        failures +=
            " " + s.describe(from) + " did not re-export buffer " + std::to_string(l.id) + ";";
        return;
      }
      try {
        maybe_device_scope scope(rt, device_of(b));
        CUmemGenericAllocationHandle h = 0;
        TAGMEM_CU(cuMemImportFromShareableHandle, &h,
                  reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[0])),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        try {
          map_everywhere(b, h);
        } catch (...) {
          release_or_keep(h);
          throw;
        }
        b.real = h;
        b.real_held = true;
        if (b.app_refs == 0) {
          release_or_keep(h);
          b.real_held = false;
        }
        b.released = false;
      } catch (const error& e) {
        failures += std::string(" ") + e.what() + ";";
      }
    });
  };
  try {
    s.mail(outbox, on_letter, "handing new handles to the ranks that map them");
  } catch (...) {
    for (int fd : exported) close_quietly(fd);
    throw;
  }
  for (int fd : exported) close_quietly(fd);
  if (!failures.empty()) fail(code, "re-sharing NCCL's buffers failed:" + failures);
}

}  // namespace

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
