// offload_engine.cpp — the copy pipeline behind offload and reload.
//
// Note [offload waits]: unmapping memory that a kernel or copy still uses is undefined
// behaviour, and tagmem cannot know every stream the application touched a tag from (PyTorch
// records extra streams itself), so offload first synchronises the device's primary context.
// Only then are the copies queued, and only after every copy has completed is anything
// unmapped: a copy that fails leaves every tag resident with its bytes where they were.
//
// Note [reload coalescing]: an offloaded tag's mappings are restored as runs of adjacent
// mappings, each run one cuMemCreate/cuMemMap/cuMemSetAccess of up to max_mapping_bytes, since
// map/unmap cost is per physical allocation (DESIGN.md: 4,096 chunks of 2 MiB cost ~0.39 s,
// 16 chunks of 512 MiB ~7 ms). After the first cycle a tag therefore has few large mappings,
// whatever the number of its allocations. Runs are cut only at old mapping boundaries, so every
// segment stays inside one mapping (block_pool::release_cached relies on that).
//
// Copies go in pieces of copy_piece_bytes, round-robin over the device's copy streams, so
// several are in flight and mapping the next run overlaps copying the previous one.
#include "offload_engine.hpp"

#include <algorithm>

#include "driver/driver.hpp"

namespace tagmem {
namespace {

// Lays the tag's resident mappings onto host extents, cut at extent boundaries and at `piece`
// bytes, in device-address order.
meta_vector<backup_piece> lay_out(tag& t, const meta_vector<host_extent>& extents,
                                  std::size_t piece) {
  meta_vector<backup_piece> out;
  std::size_t e = 0, e_off = 0;
  for (auto& [va, m] : t.arena().mappings()) {
    if (!m.resident) continue;
    std::size_t done = 0;
    while (done < m.size) {
      TAGMEM_ASSERT(e < extents.size());
      std::size_t n = std::min({piece, m.size - done, extents[e].size - e_off});
      out.push_back({va + done, extents[e].ptr + e_off, n});
      done += n;
      e_off += n;
      if (e_off == extents[e].size) {
        ++e;
        e_off = 0;
      }
    }
  }
  return out;
}

std::size_t resident_bytes(tag& t) {
  std::size_t n = 0;
  for (auto& [va, m] : t.arena().mappings()) n += m.resident ? m.size : 0;
  return n;
}

// Drops pieces whose device range lies in a mapping that is still resident.
void drop_resident_pieces(tag& t) {
  auto& maps = t.arena().mappings();
  auto& pieces = t.pieces();
  std::erase_if(pieces, [&](const backup_piece& p) {
    auto it = maps.upper_bound(p.dev);
    return it != maps.begin() && std::prev(it)->second.resident;
  });
}

struct staged {
  tag* t;
  meta_vector<host_extent> extents;
  meta_vector<backup_piece> pieces;
  std::size_t bytes;
};

}  // namespace

void offload_tags(device& dev, tag* const* tags, std::size_t count, tagmem_offload_mode mode,
                  host_store& store, const config& cfg) {
  context_guard guard(dev.context());
  TAGMEM_CU(cuCtxSynchronize, dev.context());  // Note [offload waits]

  // 1. Host space and the copy plan for every tag; nothing is changed yet.
  meta_vector<staged> work;
  work.reserve(count);
  auto give_back = [&](std::size_t from) {
    for (std::size_t i = from; i < work.size(); ++i) store.release(work[i].extents);
  };
  try {
    for (std::size_t i = 0; i < count; ++i) {
      staged s{tags[i], {}, {}, resident_bytes(*tags[i])};
      if (mode == TAGMEM_BACKUP && s.bytes) {
        s.extents = store.acquire(s.bytes);
        work.push_back(std::move(s));
        work.back().pieces = lay_out(*work.back().t, work.back().extents, cfg.copy_piece_bytes);
      } else {
        work.push_back(std::move(s));
      }
    }
  } catch (...) {
    give_back(0);
    throw;
  }

  // 2. Copies, all queued before any is waited for; a failure leaves every tag as it was.
  if (mode == TAGMEM_BACKUP) {
    try {
      std::size_t next = 0;
      for (staged& s : work) {
        for (const backup_piece& p : s.pieces) {
          TAGMEM_CU(cuMemcpyDtoHAsync, p.host, p.dev, p.bytes, dev.d2h_stream(next++));
        }
      }
      dev.synchronize_copy_streams();
    } catch (...) {
      try {
        dev.synchronize_copy_streams();
      } catch (...) {
      }
      give_back(0);
      throw;
    }
  }

  // 3. Unmap and release, tag by tag; the backup now holds every byte.
  for (std::size_t i = 0; i < work.size(); ++i) {
    staged& s = work[i];
    tag& t = *s.t;
    // Join what an earlier, interrupted offload already moved out.
    auto& pieces = t.pieces();
    pieces.insert(pieces.end(), s.pieces.begin(), s.pieces.end());
    std::sort(pieces.begin(), pieces.end(),
              [](const backup_piece& a, const backup_piece& b) { return a.dev < b.dev; });
    t.extents().insert(t.extents().end(), s.extents.begin(), s.extents.end());
    s.extents.clear();
    t.set_offloaded(mode, true);
    for (auto& [va, m] : t.arena().mappings()) {
      if (!m.resident) continue;
      try {
        t.arena().unmap(va);
      } catch (...) {
        drop_resident_pieces(t);  // the tag stays partial: retry offload or reload it
        give_back(i + 1);
        throw;
      }
    }
    t.set_offloaded(t.mode(), false);
    t.counters().offload_count++;
    t.counters().bytes_offloaded += mode == TAGMEM_BACKUP ? s.bytes : 0;
  }
}

namespace {

struct run {
  CUdeviceptr va;
  std::size_t size;
  CUmemGenericAllocationHandle handle;
};

// Adjacent non-resident mappings grouped into runs of at most max_bytes (a single larger
// mapping forms a run of its own). Note [reload coalescing].
meta_vector<run> plan_runs(tag& t, std::size_t max_bytes) {
  meta_vector<run> runs;
  for (auto& [va, m] : t.arena().mappings()) {
    if (m.resident) continue;
    if (!runs.empty() && runs.back().va + runs.back().size == va &&
        runs.back().size + m.size <= max_bytes) {
      runs.back().size += m.size;
    } else {
      runs.push_back({va, m.size, 0});
    }
  }
  return runs;
}

}  // namespace

void reload_tag(device& dev, tag& t, host_store& store, const config& cfg) {
  context_guard guard(dev.context());
  meta_vector<run> runs = plan_runs(t, cfg.max_mapping_bytes);
  std::size_t mapped = 0;  // runs[0, mapped) are mapped
  auto undo = [&] {
    try {
      dev.synchronize_copy_streams();
    } catch (...) {
    }
    for (std::size_t i = 0; i < mapped; ++i) {
      try {
        unmap_physical(runs[i].va, runs[i].size, runs[i].handle);
      } catch (...) {
      }
    }
  };
  std::size_t copied = 0;
  try {
    const auto& pieces = t.pieces();
    auto p = pieces.begin();
    std::size_t next = 0;
    for (run& r : runs) {
      r.handle = map_physical(dev, r.va, r.size);
      ++mapped;
      // Pieces (none for DISCARD) are sorted by address; copy those inside this run while the next
      // run maps.
      while (p != pieces.end() && p->dev < r.va) ++p;
      for (; p != pieces.end() && p->dev < r.va + r.size; ++p) {
        TAGMEM_CU(cuMemcpyHtoDAsync, p->dev, p->host, p->bytes, dev.h2d_stream(next++));
        copied += p->bytes;
      }
    }
    dev.synchronize_copy_streams();
  } catch (...) {
    undo();
    throw;
  }
  // Commit: nothing below can fail except allocating records.
  for (const run& r : runs) t.arena().adopt(r.va, r.size, r.handle);
  store.release(t.extents());
  t.extents().clear();
  t.pieces().clear();
  t.set_resident();
  t.counters().reload_count++;
  t.counters().bytes_reloaded += copied;
}

}  // namespace tagmem
