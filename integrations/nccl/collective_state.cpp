// collective_state.cpp — the counts and the shared helpers of the NCCL pause and resume (see
// header).
#include "collective_state.hpp"

#include <algorithm>
#include <string>

#include "backup_extents.hpp"
#include "bounded_wait.hpp"

namespace tagmem::nccl::detail {

state g_state;

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

bool any_failed(const std::vector<rank_outcome>& all) {
  return std::any_of(all.begin(), all.end(),
                     [](const rank_outcome& o) { return o.status != TAGMEM_SUCCESS; });
}

std::exception_ptr open_runtime(std::optional<runtime::hold>& rt) {
  try {
    rt.emplace();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

const mapping_record* full_mapping(const allocation& a) {
  for (const mapping_record& m : a.mappings)
    if (m.offset == 0 && m.size == a.size) return &m;
  return nullptr;
}

std::string ms(int timeout_ms) { return std::to_string(timeout_ms) + " ms"; }

CUresult wait_for_copies(device& dev, int timeout_ms, std::function<void()> if_late) {
  wait_outcome w = wait_bounded(
      dev.ordinal(), dev.context(), deadline_after(timeout_ms),
      [&dev] { return dev.wait_copy_streams(); }, std::move(if_late));
  if (!w.in_time)
    fail(TAGMEM_ERROR_TIMEOUT, "copies on device " + std::to_string(dev.ordinal()) +
                                   " did not finish within " + ms(timeout_ms));
  return w.status;
}

meta_vector<backup_piece> pieces_of(const allocation& a, std::size_t piece_bytes) {
  meta_vector<backup_piece> out;
  extent_cursor cursor{a.backup};
  CUdeviceptr va = full_mapping(a)->va;
  cut_pieces(va, va + a.size, cursor, piece_bytes, out);
  return out;
}

void give_back_backups(const std::vector<allocation*>& list) {
  for (allocation* a : list) {
    return_backup(a->backup);
    a->backup.clear();
  }
}

bool holds(const meta_vector<process_identity>& list, const process_identity& p) {
  return std::any_of(list.begin(), list.end(),
                     [&](const process_identity& q) { return q.same_as(p); });
}

std::string owner_mismatch(const group_session& s, const allocation& b) {
  if (b.source_rank < s.size() && b.source_process.same_as(s.member(b.source_rank))) return {};
  std::string now = b.source_rank < s.size()
                        ? s.describe(b.source_rank) + " is " + s.member(b.source_rank).describe()
                        : "the group has no rank " + std::to_string(b.source_rank);
  return s.describe(s.rank()) + " maps buffer " + std::to_string(b.source_id) + " of " +
         b.source_process.describe() + " (rank " + std::to_string(b.source_rank) +
         " when it was matched), but " + now + ": not the process it was shared with";
}

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

}  // namespace tagmem::nccl::detail
