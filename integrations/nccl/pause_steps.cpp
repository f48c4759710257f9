// pause_steps.cpp — the steps of the NCCL pause (see header; the protocol is in collective.cpp).
#include "pause_steps.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <memory>

#include "backup_extents.hpp"
#include "bounded_wait.hpp"
#include "collective_messages.hpp"
#include "peers/fd_identity.hpp"
#include "peers/messages.hpp"
#include "tagmem/tagmem_nccl.h"

namespace tagmem::nccl::detail {

using namespace peers;  // the group session, its messages and descriptor passing

namespace {

// Work left over from an earlier call that timed out must end before this one touches a device.
void settle_earlier_waits(deadline until, int timeout_ms) {
  int busy = -1;
  if (!settle_late_waits(until, &busy))
    fail(TAGMEM_ERROR_TIMEOUT, "device " + std::to_string(busy) +
                                   " is still busy with work that outlived an earlier timeout "
                                   "(waited " +
                                   ms(timeout_ms) + ")");
}

// Whether this process's side of `a` allows a release (Note [what stays resident]).
bool releasable_here(const allocation& a) {
  if (a.released || a.foreign_export || a.multicast || a.dma_buf) return false;
  if (a.from == origin::imported) return a.source_rank >= 0;
  return full_mapping(a) != nullptr;
}

// The count of `c` that `a`'s bytes go to, by its origin.
std::size_t& origin_slot(released_counts& c, const allocation& a) {
  if (a.from == origin::imported) return c.imported_bytes;
  return a.exported_ever ? c.exported_bytes : c.local_bytes;
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

}  // namespace

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

void match(group_session& s) {
  // 1. Every import not yet matched goes, as a duplicate of its fd, to every other rank.
  std::vector<letter> outbox;
  records().for_each([&](allocation& b) {
    if (b.from != origin::imported || b.released || b.import_fd < 0) return;
    for (int r = 0; r < s.size(); ++r) {
      if (r != s.rank()) outbox.push_back({r, encode_match_letter({b.id, 0}), {b.import_fd}});
    }
  });
  // 2. The owner compares each with the exports no process was found holding yet; a match is
  // its own finding that the sender's process holds that export, and it answers the sender
  // alone, with its record id and a duplicate of the export.
  std::vector<letter> answers;
  s.mail(
      outbox,
      [&](int from, const std::string& blob, owned_fds& fds) {
        match_letter l =
            decode_from(s.describe(from), "matching", [&] { return decode_match_letter(blob); });
        if (l.owner_id != 0 || fds.size() != 1) return;  // no honest importer sends that
        records().for_each([&](allocation& a) {
          if (!local(a) || a.released) return;
          for (export_record& e : a.exports) {
            if (e.matched || !same_open_file(e.fd, fds[0])) continue;
            e.matched = true;
            if (!holds(a.importers, s.member(from))) a.importers.push_back(s.member(from));
            answers.push_back({from, encode_match_letter({l.importer_id, a.id}), {e.fd}});
          }
        });
      },
      "matching the buffers shared between ranks");
  // 3. The importer checks the answer holds the very file it imported before it takes the
  // sender as the owner.
  s.mail(
      answers,
      [&](int from, const std::string& blob, owned_fds& fds) {
        match_letter l =
            decode_from(s.describe(from), "matching", [&] { return decode_match_letter(blob); });
        allocation* b = records().by_id(l.importer_id);
        if (!b || b->from != origin::imported || b->import_fd < 0 || l.owner_id == 0 ||
            fds.size() != 1 || !same_open_file(b->import_fd, fds[0]))
          return;
        b->source_rank = from;
        b->source_id = l.owner_id;
        b->source_process = s.member(from);
      },
      "learning who owns the buffers shared between ranks");
  records().for_each([&](allocation& b) {
    if (b.from == origin::imported && b.source_rank >= 0 && b.import_fd >= 0) {
      close_quietly(b.import_fd);  // matched for good
      b.import_fd = -1;
    }
  });
}

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
      mine.push_back({b.source_rank, b.source_id, releasable_here(b)});
    }
  });
  std::vector<std::string> all =
      s.all_gather(encode_claims(mine), "telling owners who maps their buffers");
  std::map<std::uint64_t, bool> importers_agree;  // my record id -> every claimer can release
  for (int rank = 0; rank < s.size(); ++rank) {
    for (const claim& c : decode_from(s.describe(rank), "claiming buffers",
                                      [&] { return decode_claims(all[rank]); })) {
      if (c.owner != s.rank()) continue;
      const allocation* a = records().by_id(c.id);
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

void forget_backups(const std::set<std::uint64_t>& release) {
  for (std::uint64_t id : release) {
    allocation* a = records().by_id(id);
    if (a && !a->released && !a->backup.empty()) give_back_backups({a});
  }
}

void detach_all(const runtime::hold& rt, const std::set<std::uint64_t>& release,
                std::vector<detached>& off) {
  off.reserve(release.size());
  for (std::uint64_t id : release) {
    allocation* a = records().by_id(id);
    maybe_device_scope scope(rt, device_of(*a));
    off.push_back(detach(*a));
  }
}

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

}  // namespace tagmem::nccl::detail
