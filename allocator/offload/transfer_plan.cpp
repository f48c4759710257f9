// transfer_plan.cpp — copy and mapping plans for the offload engine (see transfer_plan.hpp).
#include "offload/transfer_plan.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "tags/backup_retention.hpp"

namespace tagmem {

void plan_outgoing(outgoing& o, const mapping_filter& only) {
  for (auto& [va, m] : o.t->arena().mappings()) {
    if (!m.resident || (only && !only(va, m.size))) continue;
    o.maps.push_back({va, m.size, 0});
    o.bytes += m.size;
  }
}

namespace {

// Cuts `o`'s copies over its extents; each mapping learns which copies cover it.
void cut_outgoing(outgoing& o, std::size_t piece_bytes) {
  extent_cursor cursor{o.extents};
  for (std::size_t i = 0; i < o.maps.size();) {
    // A contiguous range of resident mappings: [maps[i], maps[j]).
    CUdeviceptr end = o.maps[i].va + o.maps[i].size;
    std::size_t j = i + 1;
    for (; j < o.maps.size() && o.maps[j].va == end; ++j) end += o.maps[j].size;
    cut_pieces(o.maps[i].va, end, cursor, piece_bytes, o.pieces);  // Note [copies span mappings]
    i = j;
  }
  for (out_mapping& m : o.maps) {
    auto after = std::lower_bound(
        o.pieces.begin(), o.pieces.end(), m.va + m.size,
        [](const backup_piece& p, CUdeviceptr address) { return p.dev < address; });
    m.pieces_end = static_cast<std::size_t>(after - o.pieces.begin());
  }
}

bool holds_kept_backup(const tag& t) noexcept { return !t.offloaded() && t.kept(); }

}  // namespace

void plan_host_memory(outgoing* outs, std::size_t n, tagmem_offload_mode mode, host_store& store,
                      std::size_t piece_bytes) {
  if (mode != TAGMEM_BACKUP) {  // nothing is copied: kept backups simply go
    for (std::size_t i = 0; i < n; ++i) drop_kept_backup(*outs[i].t, store);
    return;
  }
  std::size_t total = 0, returned_total = 0;
  meta_vector<host_extent> kept;
  for (std::size_t i = 0; i < n; ++i) {
    tag& t = *outs[i].t;
    if (gives_backup_back(t)) {  // Note [backups given back to the system]: fresh extents only
      drop_kept_backup(t, store);
      returned_total += outs[i].bytes;
    } else {
      total += outs[i].bytes;
      if (holds_kept_backup(t)) kept.insert(kept.end(), t.extents().begin(), t.extents().end());
    }
  }
  // Those given back first: all new, so a failure of the second acquire gives them back whole.
  meta_vector<host_extent> returned;
  if (returned_total) returned = store.acquire_returned(returned_total);
  meta_vector<host_extent> all;
  try {
    all = store.acquire(total, kept);  // Note [kept backup until planned]
  } catch (...) {
    store.release_and_unpin(returned);
    throw;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (holds_kept_backup(*outs[i].t)) forget_kept_backup(*outs[i].t);  // its memory is in `all`
  }
  try {
    struct cursor {
      const meta_vector<host_extent>& list;
      std::size_t at = 0;
      std::size_t offset = 0;  // bytes of list[at] handed out
    } plain{all}, back{returned};
    for (std::size_t i = 0; i < n; ++i) {
      outgoing& o = outs[i];
      cursor& c = gives_backup_back(*o.t) ? back : plain;
      for (std::size_t left = o.bytes; left;) {
        const std::size_t take = std::min(left, c.list[c.at].size - c.offset);
        o.extents.push_back({c.list[c.at].ptr + c.offset, take});
        left -= take;
        c.offset += take;
        if (c.offset == c.list[c.at].size) {
          ++c.at;
          c.offset = 0;
        }
      }
      cut_outgoing(o, piece_bytes);
    }
  } catch (...) {
    store.release(all);
    store.release_and_unpin(returned);
    for (std::size_t i = 0; i < n; ++i) {
      outs[i].extents.clear();
      outs[i].pieces.clear();
    }
    throw;
  }
}

void keep_offloaded_pieces(tag& t) {
  auto& maps = t.arena().mappings();
  meta_vector<backup_piece> kept;
  for (const backup_piece& p : t.pieces()) {
    CUdeviceptr at = p.dev;
    const CUdeviceptr end = p.dev + p.bytes;
    auto it = maps.upper_bound(at);
    if (it != maps.begin()) --it;
    for (; at < end && it != maps.end(); ++it) {
      CUdeviceptr m_start = it->first;
      CUdeviceptr m_end = m_start + it->second.size;
      if (m_end <= at) continue;
      if (m_start > at) at = std::min<CUdeviceptr>(m_start, end);  // a hole: nothing there
      CUdeviceptr stop = std::min(m_end, end);
      if (at < stop && !it->second.resident) {
        kept.push_back({at, p.host + (at - p.dev), std::size_t(stop - at)});
      }
      at = std::max(at, stop);
    }
  }
  t.pieces() = std::move(kept);
}

void plan_incoming(incoming& in, std::size_t max_mapping_bytes) {
  tag& t = *in.t;
  if (t.partial()) keep_offloaded_pieces(t);
  for (auto& [va, m] : t.arena().mappings()) {
    if (m.resident) continue;
    if (!in.runs.empty() && in.runs.back().va + in.runs.back().size == va &&
        in.runs.back().size + m.size <= max_mapping_bytes) {
      in.runs.back().size += m.size;  // Note [reload coalescing]
    } else {
      in.runs.push_back({va, m.size, {}});
    }
  }
}

}  // namespace tagmem
