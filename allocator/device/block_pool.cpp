// block_pool.cpp — segments, blocks, best-fit reuse and merging (see block_pool.hpp).
#include "device/block_pool.hpp"

#include "base/byte_math.hpp"
#include "driver/driver.hpp"

namespace tagmem {

namespace {

// Note [stream-ordered reuse]: the handles that may mean another stream in another thread.
bool names_one_stream(CUstream s) { return s != CU_STREAM_PER_THREAD; }
bool waits_on_host(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY; }

}  // namespace

bool block_pool::by_size::operator()(const block* a, const block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

block_pool::block_pool(vm_arena& arena, const config& cfg) : arena_(arena), cfg_(cfg) {}

block_pool::~block_pool() {
  for (auto& [base, s] : segments_) {
    for (block* b = s->first; b;) {
      block* next = b->next;
      forget_event(b);
      delete b;
      b = next;
    }
    delete s;
  }
}

void block_pool::forget_event(block* b) noexcept {
  if (!b->freed) return;
  arena_.dev().release_event(b->freed);
  b->freed = nullptr;
}

// Note [stream-ordered reuse]: makes `stream` (or the host) wait for the work that used `b`.
void block_pool::order_reuse(const block* b, CUstream stream) {
  device& d = arena_.dev();
  if (b->freed) {
    if (waits_on_host(stream))
      TAGMEM_CU(cuEventSynchronize, b->freed);
    else
      TAGMEM_CU(cuStreamWaitEvent, stream, b->freed, 0);
  } else if (waits_on_host(stream)) {
    d.wait_on_host(b->stream);
  } else {
    d.order_after(stream, b->stream);
  }
}

void block_pool::cache(block* b) { lists_for(b->seg)[b->stream].insert(b); }

void block_pool::uncache(block* b) {
  free_lists& lists = lists_for(b->seg);
  auto list = lists.find(b->stream);
  TAGMEM_ASSERT(list != lists.end() && list->second.count(b) == 1);
  list->second.erase(b);  // an emptied list stays until a search passes it (take_free)
}

block* block_pool::take_free(std::size_t size, CUstream stream, bool small) {
  free_lists& lists = small ? free_small_ : free_large_;
  const bool own = names_one_stream(stream);
  auto list = own ? lists.find(stream) : lists.end();
  free_list::iterator fit;
  if (list != lists.end()) fit = list->second.lower_bound(size);
  if (list == lists.end() || fit == list->second.end()) {
    // Note [stream-ordered reuse]: the best fit among the other streams' cached blocks.
    list = lists.end();
    for (auto other = lists.begin(); other != lists.end();) {
      if (other->second.empty()) {
        other = lists.erase(other);
        continue;
      }
      if (!own || other->first != stream) {
        auto candidate = other->second.lower_bound(size);
        if (candidate != other->second.end() &&
            (list == lists.end() || (*candidate)->size < (*fit)->size)) {
          list = other;
          fit = candidate;
        }
      }
      ++other;
    }
    if (list == lists.end()) return nullptr;
    order_reuse(*fit, stream);
  }
  block* b = *fit;
  list->second.erase(fit);
  if (own) {
    forget_event(b);
    b->stream = stream;
  }  // else split() gives the stream and event to the remainder (Note [stream-ordered reuse])
  return b;
}

block* block_pool::new_segment(std::size_t size, bool small) {
  const std::size_t gran = arena_.dev().granularity();
  std::size_t seg_size =
      small ? cfg_.chunk_bytes
      : size <= medium_limit
          ? round_up(cfg_.large_segment_bytes, gran)
          : round_up_checked(size, gran, TAGMEM_ERROR_INVALID_ARGUMENT, "an allocation");
  CUdeviceptr va = arena_.allocate_va(seg_size);
  try {
    arena_.map_new(va, seg_size);
  } catch (...) {
    arena_.free_va(va, seg_size);
    throw;
  }
  auto* s = new segment();
  auto* b = new block();
  s->base = va;
  s->size = seg_size;
  s->small = small;
  s->first = b;
  b->ptr = va;
  b->size = seg_size;
  b->seg = s;
  segments_.emplace(va, s);
  totals_.reserved_bytes += seg_size;
  return b;
}

block* block_pool::split(block* b, std::size_t size) {
  std::size_t rest = b->size - size;
  bool worth = b->seg->small ? rest >= alignment : rest > small_limit;
  if (!worth) return b;
  auto* r = new block();
  r->ptr = b->ptr + size;
  r->size = rest;
  r->stream = b->stream;
  r->freed = b->freed;
  b->freed = nullptr;
  r->seg = b->seg;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  cache(r);
  return b;
}

block* block_pool::allocate(std::size_t size, CUstream stream) {
  std::size_t rounded =
      round_up_checked(size, alignment, TAGMEM_ERROR_INVALID_ARGUMENT, "an allocation");
  bool small = rounded <= small_limit;
  block* b = take_free(rounded, stream, small);
  if (!b) {
    b = new_segment(rounded, small);
    if (names_one_stream(stream)) b->stream = stream;  // else no stream: nothing used it yet
  }
  split(b, rounded);
  forget_event(b);
  b->allocated = true;
  b->requested = size;
  b->seg->live++;
  live_.emplace(b->ptr, b);
  totals_.allocated_bytes += rounded;  // tagmem.h: the request rounded to the alignment, not
                                       // the block, which may keep an unsplit tail
  totals_.requested_bytes += size;
  totals_.live_allocations++;
  return b;
}

block* block_pool::find_containing(CUdeviceptr address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  const segment* s = std::prev(it)->second;
  if (address - s->base >= s->size) return nullptr;
  for (block* b = s->first; b; b = b->next) {
    if (address - b->ptr < b->size) return b->allocated ? b : nullptr;
  }
  return nullptr;
}

void block_pool::live_ranges(meta_vector<std::pair<CUdeviceptr, std::size_t>>& out) const {
  out.reserve(out.size() + live_.size());
  for (const auto& [base, s] : segments_) {
    for (const block* b = s->first; b; b = b->next) {
      if (b->allocated) out.emplace_back(b->ptr, b->size);
    }
  }
}

void block_pool::unused_segments(meta_vector<std::pair<CUdeviceptr, std::size_t>>& out) const {
  for (const auto& [base, s] : segments_) {
    if (s->live == 0) out.emplace_back(base, s->size);
  }
}

block* block_pool::retire(CUdeviceptr ptr, CUstream stream) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return nullptr;
  block* b = it->second;
  CUevent freed = nullptr;
  if (!names_one_stream(stream)) {  // Note [stream-ordered reuse]: record in the freeing thread
    device& d = arena_.dev();
    context_guard guard(d.context());
    freed = d.acquire_event();
    try {
      TAGMEM_CU(cuEventRecord, freed, stream);
    } catch (...) {
      d.release_event(freed);
      throw;
    }
  }
  live_.erase(it);
  totals_.allocated_bytes -= round_up(b->requested, alignment);
  totals_.requested_bytes -= b->requested;
  totals_.live_allocations--;
  b->allocated = false;
  b->requested = 0;
  b->stream = stream;
  b->freed = freed;
  return b;
}

bool block_pool::free(CUdeviceptr ptr, CUstream stream) {
  block* b = retire(ptr, stream);
  if (!b) return false;
  b->seg->live--;
  merge_free(b);
  return true;
}

bool block_pool::hold(CUdeviceptr ptr, CUstream stream) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  block* b = it->second;
  auto h = held_.emplace(ptr, b).first;  // may throw: nothing changed yet
  try {
    retire(ptr, stream);
  } catch (...) {
    held_.erase(h);
    throw;
  }
  b->held = true;
  return true;
}

bool block_pool::release_held(CUdeviceptr ptr) {
  auto it = held_.find(ptr);
  if (it == held_.end()) return false;
  block* b = it->second;
  held_.erase(it);
  b->held = false;
  b->seg->live--;
  merge_free(b);
  return true;
}

void block_pool::merge_free(block* b) {
  auto mergeable = [&](block* n) {
    return n && !n->allocated && !n->held && n->stream == b->stream && !n->freed && !b->freed;
  };
  if (mergeable(b->prev)) {
    block* p = b->prev;
    uncache(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (mergeable(b->next)) {
    block* n = b->next;
    uncache(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  cache(b);
}

void block_pool::erase_segment(segment* s) {
  for (block* b = s->first; b;) {
    block* next = b->next;
    uncache(b);  // every block of an idle segment is cached
    forget_event(b);
    delete b;
    b = next;
  }
  totals_.reserved_bytes -= s->size;
  segments_.erase(s->base);
  delete s;
}

bool block_pool::has_releasable() const {
  if (arena_.has_unreleased()) return true;
  for (const auto& [va, m] : arena_.mappings()) {
    bool idle = true;
    for (auto s = segments_.lower_bound(va); s != segments_.lower_bound(va + m.size) && idle; ++s) {
      idle = s->second->live == 0;
    }
    if (idle) return true;
  }
  return false;
}

std::size_t block_pool::release_cached() {
  arena_.release_unreleased();
  std::size_t released = 0;
  auto& maps = arena_.mappings();
  for (auto it = maps.begin(); it != maps.end();) {
    const CUdeviceptr va = it->first;
    const std::size_t size = it->second.size;
    ++it;  // the record may be erased below
    auto first = segments_.lower_bound(va);
    auto last = segments_.lower_bound(va + size);
    bool idle = true;
    for (auto s = first; s != last && idle; ++s) idle = s->second->live == 0;
    if (!idle) continue;
    auto drop = [&] {
      meta_vector<segment*> doomed;
      for (auto s = first; s != last; ++s) doomed.push_back(s->second);
      for (segment* s : doomed) erase_segment(s);
      arena_.forget(va);
      arena_.free_va(va, size);
    };
    try {
      arena_.unmap(va);
    } catch (...) {
      // Only cuMemRelease failed (Note [release later] in vm_arena.cpp): the memory is unmapped,
      // so its segments must go all the same, or later requests would be served from it.
      if (maps.at(va).resident) throw;  // cuMemUnmap failed: nothing changed
      drop();
      throw;
    }
    drop();
    released += size;
  }
  return released;
}

}  // namespace tagmem
