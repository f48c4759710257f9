// offload_engine.cpp — the copy pipeline behind offload, reload and swap.
//
// Note [offload waits]: unmapping memory that a kernel or copy still uses is undefined
// behaviour, and tagmem cannot know every stream the application touched a tag from (PyTorch
// records extra streams itself), so a pipeline with tags going out first synchronises the
// device's primary context.
//
// Note [unmap as copied]: every device-to-host copy of every out-tag is queued at once, in
// copy_piece_bytes pieces round-robin over the device's D2H streams, each followed by an event
// (copy_queue.hpp).
// A queueing failure therefore happens before anything is unmapped and leaves every tag as it
// was. When the in-side only fits as the out-side goes (a memory-tight swap), the pieces go to
// one D2H stream instead, so that out-mappings finish, and are unmapped, in address order
// (copy_queue::keep_d2h_order says why). So do they in an offload with nothing coming in on a
// device whose job's processes take what it unmaps (Note [handoff] in handoff/service.hpp): a
// process reloading beside it can map each mapping only once it is handed over, and with another
// process copying the copy engines were seen to serve one D2H stream of a process at a time, so
// that round-robin pieces handed the first mapping over only once half of the offload was copied
// (docs/handoff.md, "Handed in order"). Then one loop on the calling thread unmaps each
// out-mapping as soon as the events of the copies covering it have fired, and maps each in-run as
// soon as device memory allows, queueing its host-to-device copies on the H2D streams: unmapping
// overlaps copying, and in a swap both PCIe directions run at once. When the in-tags only fit once
// the out-tags are gone, an in-run waits until enough out-mappings are unmapped (a budget started
// from cuMemGetInfo; an out-of-memory from cuMemCreate while out-mappings remain means "wait for
// more", not failure). A copy that fails once unmapping has begun (an asynchronous error, which
// CUDA makes sticky) cannot be undone by not unmapping; the out-tags are then reloaded from their
// backups, which hold every byte already unmapped, so that "a failed copy leaves every tag
// resident" still holds wherever the driver still works, and nothing is lost where it does not. In
// a swap the out-side's handles are not released: they go to the device's recycler and the in-runs
// map them (Note [physical recycling] in physical_recycler.hpp); what the in-side does not take
// goes to the release queue when the swap ends, unless TAGMEM_RECYCLE_PHYSICAL=keep.
//
// Note [reload coalescing]: an offloaded tag's mappings come back as runs of adjacent mappings,
// each one cuMemCreate/cuMemMap/cuMemSetAccess of up to max_mapping_bytes, since map/unmap cost is
// per physical allocation (docs/performance.md, "Mapping costs"). After the first cycle a tag
// therefore has few large mappings, whatever the number of its allocations. Runs are cut only at
// old mapping boundaries, so every segment stays inside one mapping (block_pool::release_cached
// relies on that). A BACKUP tag's runs stay at 1 GiB so that copies start while later runs are
// still being mapped. A DISCARD tag has nothing to copy; its runs go up to discard_mapping_bytes,
// also 1 GiB by default: larger runs reload faster when the driver is quiet, but the driver
// releases large handles more slowly and creates them erratically right after a release, which is
// when an RL phase switch reloads (docs/performance.md, "kv cache (DISCARD)"). Memory inside a
// large mapping goes back to the driver (empty_cache) only once all of it is free.
#include "offload/offload_engine.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>

#include "driver/driver.hpp"
#include "observe/trace.hpp"
#include "offload/give_way.hpp"
#include "offload/phase_report.hpp"
#include "offload/transfer_plan.hpp"
#include "tags/backup_retention.hpp"
#include "transfer/copy_queue.hpp"

namespace tagmem {
namespace {

// The most bytes that runs [from, end) of `in` lay side by side in address space: the largest
// received handle such a reload can map (Note [runs grow to the handles held]).
std::size_t largest_span(const incoming& in, std::size_t from) {
  std::size_t largest = 0, span = 0;
  for (std::size_t j = from; j < in.runs.size(); ++j) {
    const in_run& r = in.runs[j];
    const bool adjacent = j > from && in.runs[j - 1].va + in.runs[j - 1].size == r.va;
    span = adjacent ? span + r.size : r.size;
    largest = std::max(largest, span);
  }
  return largest;
}

// A reload copying with all the memory it needs in hand, as the job's processes see it
// (peer_memory::copying); nothing without peers.
class copying_mark {
 public:
  explicit copying_mark(peer_memory* peers) noexcept : peers_(peers) {}
  ~copying_mark() { set(false); }
  copying_mark(const copying_mark&) = delete;
  copying_mark& operator=(const copying_mark&) = delete;

  bool on() const noexcept { return on_; }
  void set(bool on) noexcept {
    if (!peers_ || on == on_) return;
    on_ = on;
    peers_->copying(on);
  }

 private:
  peer_memory* const peers_;
  bool on_ = false;
};

class pipeline {
 public:
  pipeline(device& dev, tagmem_offload_mode mode, host_store& store, const config& cfg)
      : dev_(dev),
        mode_(mode),
        store_(store),
        cfg_(cfg),
        copies_(dev, h2d_lanes::by_room),
        way_(dev),
        mark_(dev.peers()) {}
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;

  ~pipeline();
  void run(tag* const* outs, std::size_t out_count, tag* const* ins, std::size_t in_count,
           const std::function<void()>& queued = {});
  // Out-tags offload only the mappings `only` accepts, uncounted (discard_mappings).
  void set_filter(const mapping_filter* only) noexcept { only_ = only; }

 private:
  bool out_left() const noexcept { return out_at_ < outs_.size(); }
  bool recycle() const noexcept { return cfg_.recycle != recycling::off; }
  unmapped_memory choose_out_memory(std::size_t in_count) const noexcept;
  bool in_open() const noexcept { return !in_error_ && in_at_ < ins_.size(); }

  // What unmap_next does while the next out-mapping's copies are still running.
  enum class pending_copies { give_up, wait };

  void queue_out_copies();
  bool unmap_next(pending_copies pending);
  void start(outgoing& o);
  void commit(outgoing& o);
  void restore_outs() noexcept;

  void announce_reload() noexcept;
  void open_sink() noexcept;
  bool map_next();
  void grow_to_held(incoming& in, const physical_source& held);
  void grant_access(incoming& in);
  void reclaim_parked(incoming& in);
  void queue_in_copies(incoming& in, CUdeviceptr mapped_end);
  void finish_ins();
  void commit(incoming& in);
  void undo(incoming& in) noexcept;

  device& dev_;
  tagmem_offload_mode mode_;
  host_store& store_;
  const config& cfg_;
  meta_vector<outgoing> outs_;
  meta_vector<incoming> ins_;
  std::size_t out_at_ = 0;  // outs_[0, out_at_) are committed
  std::size_t in_at_ = 0;   // ins_[0, in_at_) are fully mapped, their copies queued
  std::size_t budget_ = 0;  // free device bytes an in-run may still create (while outs remain)
  std::exception_ptr in_error_;
  copy_queue copies_;
  give_way way_;  // after copies_: opened before the queue is gone (Note [copies give way])
  unmapped_memory out_memory_ = unmapped_memory::release;  // what the out-side's unmaps do
  physical_sink* sink_ = nullptr;  // the job's processes that take what it unmaps (Note [handoff])
  const mapping_filter* only_ = nullptr;
  bool announced_ = false;  // told peers of a reload
  // Note [copying in hand]: this reload copies with all the memory it needs in hand.
  copying_mark mark_;
  bool mark_early_ = false;  // a reload alone, with copies: may mark before its last run maps
  void mark_if_in_hand() noexcept;
  std::size_t left_to_map() const noexcept;  // the bytes of the in-runs not mapped yet
  // Note [reload waits for peers]: the reload ran out of device memory and waits, until
  // wait_until_, for memory the job's processes give back.
  bool short_ = false;
  bool waiting_ = false;
  room_leave room_;  // a held handle may go for room until the next run maps
  std::chrono::steady_clock::time_point wait_start_, wait_until_;
  bool wait_for_peers(const error& why);
  void wait_for_peers_step() noexcept;
  // Note [handles before creates]: the next run waits for handles still coming from the job
  // rather than create more than the device has free; until await_until_ at most.
  bool awaiting_ = false;
  std::optional<std::chrono::steady_clock::time_point> await_until_;  // set by its first wait
  bool await_handles(const in_run& r) noexcept;
  bool should_await(const in_run& r) noexcept;
  // Pumps the copies waiting for a lane until `until` or a handle's arrival.
  void pump_until_arrival(std::chrono::steady_clock::time_point until) noexcept;
};

// ---- out side -----------------------------------------------------------------------------

void pipeline::queue_out_copies() {
  for (outgoing& o : outs_) {
    o.done.reserve(o.pieces.size());
    for (const backup_piece& p : o.pieces) o.done.push_back(copies_.to_host(p, o.t->name()));
  }
}

// Unmaps the next out-mapping once its copies have finished, or commits the current out-tag when
// it has none left. Returns whether it did either.
bool pipeline::unmap_next(pending_copies pending) {
  outgoing& o = outs_[out_at_];
  if (o.next_map == o.maps.size()) {
    if (!o.started) start(o);
    commit(o);
    ++out_at_;
    return true;
  }
  const out_mapping& m = o.maps[o.next_map];
  const auto& api = driver::api();
  for (; o.waited < m.pieces_end; ++o.waited) {
    CUevent e = o.done[o.waited];
    if (pending == pending_copies::wait && (way_.active() || copies_.pieces_waiting())) {
      // The in-side's pieces waiting for a lane go on while this waits (copy_queue.hpp), and
      // this thread opens the word its own pieces may wait on (Note [copies give way]).
      CUresult r;
      while ((r = api.cuEventQuery(e)) == CUDA_ERROR_NOT_READY) {
        copies_.pump();
        if (way_.active()) {
          way_.keep();
          std::this_thread::sleep_for(give_way::poll_every / 2);
        } else {
          std::this_thread::yield();
        }
      }
      driver::check(r, "cuEventQuery");
    } else if (pending == pending_copies::wait) {
      TAGMEM_CU(cuEventSynchronize, e);
    } else {
      CUresult r = api.cuEventQuery(e);
      if (r == CUDA_ERROR_NOT_READY) return false;
      driver::check(r, "cuEventQuery");
    }
  }
  if (!o.started) start(o);
  trace::span span(out_memory_ == unmapped_memory::park ? "park" : "unmap", o.t->name(), m.size,
                   trace::effect::mapped_down);
  unmapped_memory then = out_memory_;
  // What the job's processes do not take waits for their copies, if any run (Note [releases wait
  // for copies] in release_queue.hpp), rather than being released here beside them.
  if (then == unmapped_memory::release && sink_ && dev_.releases().copies_running()) {
    then = unmapped_memory::release_in_background;
  }
  o.t->arena().unmap(m.va, then, sink_);  // Note [unmap as copied]
  ++o.next_map;
  if (then == unmapped_memory::release || then == unmapped_memory::release_in_background) {
    budget_ += m.size;  // else the recycler has it
  }
  return true;
}

// The tag takes this offload's pieces and extents and is offloaded-partial until committed.
void pipeline::start(outgoing& o) {
  tag& t = *o.t;
  auto& pieces = t.pieces();
  pieces.insert(pieces.end(), o.pieces.begin(), o.pieces.end());
  std::sort(pieces.begin(), pieces.end(),
            [](const backup_piece& a, const backup_piece& b) { return a.dev < b.dev; });
  t.extents().insert(t.extents().end(), o.extents.begin(), o.extents.end());
  o.extents.clear();
  t.set_partially_offloaded(mode_);
  o.started = true;
}

void pipeline::commit(outgoing& o) {
  if (only_) {  // partial() reads false once nothing stays mapped
    o.t->set_partially_offloaded(mode_);
    return;
  }
  o.t->set_offloaded(mode_);
  o.t->counters().offload_count++;
  o.t->counters().bytes_offloaded += mode_ == TAGMEM_BACKUP ? o.bytes : 0;
}

// After a failure on the out side: no in-tag changes, and every out-tag that began unmapping is
// reloaded from its backup (Note [unmap as copied]).
void pipeline::restore_outs() noexcept {
  way_.stop();  // the out-copies run to their end now
  try {
    copies_.finish();
  } catch (...) {  // a sticky error: the reload below fails too and the tags stay partial
  }
  for (incoming& in : ins_) undo(in);
  in_at_ = ins_.size();
  meta_vector<tag*> back;
  for (outgoing& o : outs_) {
    if (!o.started) {
      store_.release(o.extents);
      o.extents.clear();
      continue;
    }
    try {
      keep_offloaded_pieces(*o.t);
      o.t->set_partially_offloaded(o.t->mode());
      back.push_back(o.t);
    } catch (...) {  // no memory for records: the tag stays partial with every piece
    }
  }
  if (back.empty()) return;
  try {
    pipeline undo_pipeline(dev_, mode_, store_, cfg_);
    undo_pipeline.run(nullptr, 0, back.data(), back.size());
  } catch (...) {  // the tags stay partial: what is unmapped is in their backups
  }
}

// Where the out-side's memory goes: to this pipeline's own in-side or a later one (Note [physical
// recycling]), else to the release queue for a DISCARD offload (Note [background release]) and a
// swap unless TAGMEM_SWAP_RELEASE=inline, else released on the spot.
unmapped_memory pipeline::choose_out_memory(std::size_t in_count) const noexcept {
  if (cfg_.recycle == recycling::keep && mode_ == TAGMEM_DISCARD && in_count == 0) {
    return unmapped_memory::park;  // Note [parked mappings]
  }
  if (cfg_.recycle == recycling::keep || (in_count != 0 && recycle())) {
    return unmapped_memory::recycle;
  }
  const bool later = mode_ == TAGMEM_DISCARD ? cfg_.background_release
                                             : in_count != 0 && cfg_.swap_background_release;
  return later ? unmapped_memory::release_in_background : unmapped_memory::release;
}

// ---- in side ------------------------------------------------------------------------------

// Maps the next in-run (or finishes the current in-tag). Returns whether it made progress;
// false when device memory must first come back from the out side, or on a failure, which is
// kept in in_error_ (the out side goes on).
bool pipeline::map_next() {
  incoming& in = ins_[in_at_];
  const bool access_later =  // Note [access in one call]
      in.t->mode() == TAGMEM_DISCARD && !cfg_.discard_access_per_run;
  if (in.mapped == in.runs.size()) {
    if (in.next_piece != in.t->pieces().size()) {
      in_error_ = std::make_exception_ptr(
          error(TAGMEM_ERROR_INTERNAL,
                std::string("reload of tag '") + in.t->name() + "' left backup pieces uncopied"));
      return false;
    }
    if (access_later) {
      try {
        grant_access(in);
      } catch (...) {
        in_error_ = std::current_exception();
        return false;
      }
    }
    ++in_at_;
    return true;
  }
  in_run& r = in.runs[in.mapped];
  peer_memory* peers = dev_.peers();
  if (peers) {
    room_.arrivals_seen = peers->held().arrivals();  // before the try looks at what is held
    grow_to_held(in, peers->held());
    if (!out_left() && await_handles(r)) return false;
  }
  // While out-mappings remain, a run maps when the memory they gave up covers it (Note [physical
  // recycling]) or the driver's free memory does; otherwise it waits for more of them.
  const bool recycled =
      (out_memory_ == unmapped_memory::recycle && dev_.recycler().bytes() >= r.size) ||
      (peers && peers->held().bytes() >= r.size);
  if (out_left() && !recycled && r.size > budget_) return false;
  const std::size_t kept_before = dev_.recycler().bytes() + (peers ? peers->held().bytes() : 0);
  try {
    trace::span span("map", in.t->name(), r.size, trace::effect::mapped_up);
    r.parts = map_parts(dev_, r.va, r.size, recycle(), peers ? &peers->held() : nullptr, &room_,
                        !access_later);
  } catch (const error& e) {
    if (e.code() == TAGMEM_ERROR_OUT_OF_MEMORY && out_left()) {
      budget_ = 0;  // wait for the next unmap
      return false;
    }
    if (e.code() == TAGMEM_ERROR_OUT_OF_MEMORY && wait_for_peers(e)) return false;
    in_error_ = std::current_exception();
    return false;
  } catch (...) {
    in_error_ = std::current_exception();
    return false;
  }
  ++in.mapped;
  room_.allowed = true;
  const std::size_t kept_after = dev_.recycler().bytes() + (peers ? peers->held().bytes() : 0);
  const std::size_t taken = kept_before > kept_after ? kept_before - kept_after : 0;
  budget_ -= std::min(budget_, r.size - std::min(r.size, taken));  // what was created
  try {
    queue_in_copies(in, r.va + r.size);
  } catch (...) {
    in_error_ = std::current_exception();
    return false;
  }
  return true;
}

// Note [access in one call]: part of cuMemSetAccess's time is per call (the rest grows with the
// bytes and the handles under the range: docs/handoff.md). A DISCARD tag's reload has nothing to
// copy, so its runs are only mapped, and once all of them are, each stretch of runs side by side
// gets access in one call: a kv cache of 32 runs takes one call, not 32. A BACKUP tag's runs get
// access as each maps, since its copies start into them at once.
void pipeline::grant_access(incoming& in) {
  const auto& api = driver::api();
  for (std::size_t i = 0; i < in.runs.size();) {
    const CUdeviceptr va = in.runs[i].va;
    std::size_t bytes = in.runs[i].size;
    for (++i; i < in.runs.size() && in.runs[i].va == va + bytes; ++i) bytes += in.runs[i].size;
    trace::span span("access", in.t->name(), bytes);
    const CUresult r = api.cuMemSetAccess(va, bytes, &dev_.access_desc(), 1);
    if (r != CUDA_SUCCESS) driver::throw_error(r, "cuMemSetAccess");
  }
}

// Note [runs grow to the handles held]: cuMemMap maps a whole handle, so a received handle can
// back only a run at least its size, and the giver's handles are its own mappings: an engine's kv
// cache of 1.9 GiB mappings, say, where the trainer's runs stop at max_mapping_bytes (1 GiB) and at
// its tensors' ends. What the held handles do not cover, the run creates: new memory that the
// driver scrubs first, on copy engines that the other side's copies keep busy, so the reload's
// copies into it wait; and on a full device it must first send a held handle to the driver for
// room (Note [reload waits for peers]). So the next run takes in the runs adjacent to it, up to
// kGrowthPerHandle times the largest handle held, to the length at which the held handles,
// taken as map_parts takes them (largest first that fits), leave the smallest share of it to
// create: the first with nothing to create, else the shortest of the smallest share. Runs of
// 0.9 GiB against held handles of 1.9 GiB grow to 6.3 GiB (three handles, 0.6 GiB created, a
// tenth) rather than to the first length that one handle fits in, 2.7 GiB with 0.8 GiB created;
// against 1.8 GiB handles they stop at 1.8. With nothing held a run stays as planned. A reload
// announces the largest span of adjacent runs, not its largest run, as what it can use. The grown
// run is one mapping record afterwards (vm_arena::adopt), still cut only at old mapping
// boundaries.
void pipeline::grow_to_held(incoming& in, const physical_source& held) {
  constexpr std::size_t kGrowthPerHandle = 4;
  in_run& r = in.runs[in.mapped];
  const std::size_t most = std::max(r.size, kGrowthPerHandle * held.largest());
  std::size_t size = r.size, best_size = r.size;
  std::size_t least = size - held.would_take(size);  // created at best_size
  std::size_t next = in.mapped + 1, best_next = next;
  while (least != 0 && next < in.runs.size() && r.va + size == in.runs[next].va &&
         size + in.runs[next].size <= most) {
    size += in.runs[next].size;
    ++next;
    const std::size_t created = size - held.would_take(size);
    if (double(created) * double(best_size) < double(least) * double(size)) {
      least = created;
      best_size = size;
      best_next = next;
    }
  }
  r.size = best_size;
  in.runs.erase(in.runs.begin() + static_cast<std::ptrdiff_t>(in.mapped + 1),
                in.runs.begin() + static_cast<std::ptrdiff_t>(best_next));
}

// Queues the in-tag's pieces that end inside what is mapped so far (runs are mapped in address
// order and every piece lies in adjacent runs).
void pipeline::queue_in_copies(incoming& in, CUdeviceptr mapped_end) {
  const auto& pieces = in.t->pieces();
  for (; in.next_piece < pieces.size(); ++in.next_piece) {
    const backup_piece& p = pieces[in.next_piece];
    if (p.dev + p.bytes > mapped_end) break;
    copies_.to_device(p, in.t->name());
    in.copied += p.bytes;
  }
}

void pipeline::finish_ins() {
  if (ins_.empty()) return;
  std::size_t good = in_at_;
  // Note [copying in hand]: nothing more to take, only copies left.
  const bool copies =
      std::any_of(ins_.begin(), ins_.end(), [](const incoming& in) { return in.copied != 0; });
  mark_.set(copies);
  try {
    copies_.finish();
  } catch (...) {  // which copy failed is unknown: no in-tag is trusted
    if (!in_error_) in_error_ = std::current_exception();
    good = 0;
  }
  mark_.set(false);
  for (std::size_t i = 0; i < ins_.size(); ++i) {
    if (i < good) {
      commit(ins_[i]);
    } else {
      undo(ins_[i]);
    }
  }
  if (in_error_) std::rethrow_exception(in_error_);
}

void pipeline::commit(incoming& in) {
  tag& t = *in.t;
  for (in_run& r : in.runs) t.arena().adopt(r.va, r.size, std::move(r.parts));
  finish_reload_backup(t, store_);
  t.set_resident();
  t.counters().reload_count++;
  t.counters().bytes_reloaded += in.copied;
}

// Unmaps what was mapped for an in-tag; it stays offloaded with its backup. The copies into it
// must have finished (or failed) first.
void pipeline::undo(incoming& in) noexcept {
  for (std::size_t i = 0; i < in.mapped; ++i) {
    unmap_parts(dev_, in.runs[i].va, in.runs[i].size, in.runs[i].parts, recycle());
    in.runs[i].parts.clear();
  }
  for (CUdeviceptr va : in.reclaimed) {
    try {
      in.t->arena().unmap(va, unmapped_memory::park);  // parked again, as before the reload
    } catch (...) {  // unparkable and cuMemUnmap failed: it stays mapped, and the next reload
    }                // finds it resident
  }
  in.reclaimed.clear();
  in.mapped = 0;
  in.next_piece = 0;
  in.copied = 0;
}

// Takes the in-tag's parked mappings back (Note [parked mappings]): they are still mapped, so
// the plan leaves them out. Throws OUT_OF_MEMORY for the list, with nothing taken back.
void pipeline::reclaim_parked(incoming& in) {
  if (dev_.recycler().parked_bytes() == 0) return;
  vm_arena& arena = in.t->arena();
  in.reclaimed.reserve(arena.mappings().size());
  for (const auto& [va, m] : arena.mappings()) {
    if (!m.resident && arena.reclaim_parked(va)) in.reclaimed.push_back(va);  // within the room
  }
}

// ---- the job's other processes (Note [handoff] in handoff/service.hpp) ----------------------

// A reload tells the job's processes how much it maps and in runs of what size, so that memory
// they give up meanwhile comes here.
void pipeline::announce_reload() noexcept {
  peer_memory* peers = dev_.peers();
  if (!peers || ins_.empty()) return;
  std::size_t largest = 0;
  for (const incoming& in : ins_) largest = std::max(largest, largest_span(in, 0));
  peers->reloading(left_to_map(), largest);
  announced_ = true;
}

// An offload with nothing coming in offers what it unmaps to the job's processes.
void pipeline::open_sink() noexcept {
  std::size_t bytes = 0, parts = 0;
  for (const outgoing& o : outs_) {
    for (const out_mapping& m : o.maps) {
      bytes += m.size;
      ++parts;
    }
  }
  sink_ = dev_.peers()->sink_for_offload(bytes, parts);
}

pipeline::~pipeline() {
  if (sink_) dev_.peers()->offload_done();
  if (announced_) dev_.peers()->reload_done();
}

std::size_t pipeline::left_to_map() const noexcept {
  std::size_t bytes = 0;
  for (std::size_t i = in_at_; i < ins_.size(); ++i) {
    const incoming& in = ins_[i];
    for (std::size_t j = in.mapped; j < in.runs.size(); ++j) bytes += in.runs[j].size;
  }
  return bytes;
}

// Note [copying in hand]: a reload holds its copy mark (copy_gate.hpp) while it copies with all
// the memory it needs in hand, taking nothing more from the job's processes: the release threads
// of the job hold their leftovers back meanwhile (Note [releases wait for copies] in
// release_queue.hpp), and an offload that returned early holds its copies back (Note [copies give
// way] in give_way.hpp), so that this reload's copies have the link. A reload with every run
// mapped has it all. A reload alone (no tag going out of this process) marks from its start, as
// long as it has not run short: what it maps comes from memory free on the device and from what
// the job hands it, and a giver's leftovers released beside it slow its copies for far longer
// than the release takes (Note [release aftermath]), whether or not it needed that memory
// (docs/handoff.md, "Leftovers wait for the copies"). When it runs short and waits for the job's
// memory (Note [reload waits for peers]), it drops the mark, so that nobody holds back what it
// waits for, and takes it again once what it has left to map fits in what is free and what the
// job has handed it, or once the run it waited for maps.
void pipeline::mark_if_in_hand() noexcept {
  if (!mark_early_ || mark_.on() || short_ || awaiting_) return;
  if (!waiting_) {
    mark_.set(true);
    return;
  }
  const std::size_t left = left_to_map();
  try {
    std::size_t free = 0, total = 0;
    if (left != 0) dev_.memory_info(&free, &total);
    if (free + dev_.peers()->held().bytes() >= left) mark_.set(true);
  } catch (...) {  // the driver's free memory unknown: marked once the last run maps
  }
}

// Note [reload waits for peers]: with handoff, a reload that runs out of device memory with no
// out-side of its own left does not fail at once: it waits, TAGMEM_HANDOFF_WAIT_MS at most, for
// memory the job's processes give back, handed to it (it announces itself while reloading) or
// returned to the driver, and tries the run again after each arrival or every 20 ms. Its runs
// already mapped have their copies queued, so copying goes on into each piece as it arrives.
// Held handles larger than any span of adjacent runs left are released first (they could never
// be mapped: Note [runs grow to the handles held]). A run
// maps the held handles that fit in it, largest first, and creates the rest; handles rarely tile a
// run exactly (the giver's mappings are not this process's runs), and when the device is full the
// memory to create the rest is in the handles held and not used. So the run sends one of those
// to the driver (the smallest that leaves room for the rest) and creates the rest from it: at most
// one per run mapped, since the giver's own reference, until it reads TAKEN, may delay the room;
// none when a handle arrived during the try (the run may grow to it or map it: the next try, at
// once, does). At the deadline it fails OUT_OF_MEMORY as it would have: finish_ins commits the
// in-tags before the failing one and leaves it and those after offloaded with their backups
// intact. Two processes waiting for each other both time out. Returns whether the reload waits
// (false: fail now).
bool pipeline::wait_for_peers(const error& why) {
  peer_memory* peers = dev_.peers();
  if (!peers || cfg_.handoff_wait_ms <= 0) return false;
  const auto now = std::chrono::steady_clock::now();
  if (!waiting_) {
    waiting_ = true;
    trace::counter("peer_wait", 1);
    wait_start_ = now;
    wait_until_ = now + std::chrono::milliseconds(cfg_.handoff_wait_ms);
    std::size_t largest = 0;
    for (std::size_t i = in_at_; i < ins_.size(); ++i) {
      largest = std::max(largest, largest_span(ins_[i], ins_[i].mapped));
    }
    peers->release_unfit(largest);
  }
  if (now < wait_until_) {
    short_ = true;
    mark_.set(false);  // Note [copying in hand]: it waits for the job's memory now
    return true;
  }
  peers->waited(now - wait_start_, true);
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - wait_start_).count();
  in_error_ = std::make_exception_ptr(
      error(TAGMEM_ERROR_OUT_OF_MEMORY,
            std::string(why.what()) + "; waited " + std::to_string(waited_ms) +
                " ms (TAGMEM_HANDOFF_WAIT_MS) for memory from the job's processes"));
  waiting_ = false;
  trace::counter("peer_wait", 0);
  return true;
}

void pipeline::wait_for_peers_step() noexcept {
  short_ = false;
  using std::chrono::steady_clock;
  pump_until_arrival(std::min(steady_clock::now() + std::chrono::milliseconds(20), wait_until_));
}

void pipeline::pump_until_arrival(std::chrono::steady_clock::time_point until) noexcept {
  using std::chrono::steady_clock;
  // The runs mapped so far have pieces waiting for a lane: they go on copying meanwhile.
  while (copies_.pieces_waiting()) {
    const auto slice = std::min(until, steady_clock::now() + std::chrono::microseconds(500));
    if (dev_.peers()->wait_for_more(slice, room_.arrivals_seen)) return;
    copies_.pump();
    if (slice == until) return;
  }
  dev_.peers()->wait_for_more(until, room_.arrivals_seen);
}

// Note [handles before creates]: a reload alone maps what the job hands it and creates the rest
// (Note [runs grow to the handles held]). While a process of the job is still handing memory
// over to it, a run whose rest to create exceeds what the device has free would fail to create
// it; the reload would then wait for the job's memory (Note [reload waits for peers]) and, on a
// full device, send a held handle to the driver for room and create from it: a release and a
// create where a few more of the handles still coming would have covered the run. So the run
// waits for those instead, the runs mapped before it copying meanwhile, and tries again as each
// arrives, growing to what is held. It waits only while the bytes still coming could make up
// what the device lacks, at most TAGMEM_HANDOFF_WAIT_MS in all, and otherwise goes on as without
// it. Like a reload waiting for memory, it holds no copy mark meanwhile: a giver whose offload
// returned early holds its copies back while a mark is held (Note [copies give way]), and its
// handles come only as its copies end. It takes the mark again as soon as it stops waiting.
bool pipeline::await_handles(const in_run& r) noexcept {
  const bool wait = should_await(r);
  if (wait != awaiting_) {
    awaiting_ = wait;
    trace::counter("handle_wait", wait ? 1 : 0);
    // Marked again at once, not once the run maps: a giver's leftovers would go to the driver
    // beside this reload's copies while the run creates what the handles do not cover.
    if (wait) {
      mark_.set(false);
    } else {
      mark_if_in_hand();
    }
  }
  return wait;
}

bool pipeline::should_await(const in_run& r) noexcept {
  peer_memory* peers = dev_.peers();
  if (waiting_) return false;
  const std::uint64_t coming = peers->still_coming();
  if (coming == 0) return false;
  const std::size_t create = r.size - std::min(r.size, peers->held().would_take(r.size));
  if (create == 0) return false;
  std::size_t free = 0, total = 0;
  try {
    dev_.memory_info(&free, &total);
  } catch (...) {  // unknown: the create will tell
    return false;
  }
  // Waiting is worth it only if what is still coming could make up the difference.
  if (create <= free || coming < create - free) return false;
  const auto now = std::chrono::steady_clock::now();
  if (!await_until_) await_until_ = now + std::chrono::milliseconds(cfg_.handoff_wait_ms);
  return now < *await_until_;
}

// ---- the loop -----------------------------------------------------------------------------

void pipeline::run(tag* const* outs, std::size_t out_count, tag* const* ins, std::size_t in_count,
                   const std::function<void()>& queued) {
  context_guard guard(dev_.context());
  out_memory_ = choose_out_memory(in_count);
  ins_.reserve(in_count);
  try {
    for (std::size_t i = 0; i < in_count; ++i) {
      trace::span span("plan", ins[i]->name());
      ins_.push_back({});
      ins_.back().t = ins[i];
      if (ins[i]->mode() == TAGMEM_DISCARD) reclaim_parked(ins_.back());
      plan_incoming(ins_.back(), ins[i]->mode() == TAGMEM_DISCARD
                                     ? std::max(cfg_.discard_mapping_bytes, cfg_.max_mapping_bytes)
                                     : cfg_.max_mapping_bytes);
    }
  } catch (...) {
    for (incoming& in : ins_) undo(in);  // parks again what was reclaimed
    throw;
  }
  announce_reload();
  mark_early_ = out_count == 0 && dev_.peers() != nullptr &&
                std::any_of(ins_.begin(), ins_.end(),
                            [](const incoming& in) { return !in.t->pieces().empty(); });
  mark_if_in_hand();
  if (out_count) {
    TAGMEM_CU(cuCtxSynchronize, dev_.context());  // Note [offload waits]
    if (in_count) {  // before anything is taken: a failure here changes nothing
      std::size_t total = 0;
      dev_.memory_info(&budget_, &total);
      // The in-side waits for the out-side's memory: out-mappings must be copied in order.
      if (left_to_map() > budget_) copies_.keep_d2h_order();
    }
    outs_.reserve(out_count);
    try {
      for (std::size_t i = 0; i < out_count; ++i) {
        trace::span span("plan", outs[i]->name());
        outs_.push_back({});
        outs_.back().t = outs[i];
        if (outs[i]->partial()) keep_offloaded_pieces(*outs[i]);
        plan_outgoing(outs_.back(), only_ ? *only_ : mapping_filter{});
      }
      plan_host_memory(outs_.data(), outs_.size(), mode_, store_, cfg_.copy_piece_bytes);
      // Note [copies give way]: only an offload that returns early.
      if (queued && in_count == 0 && cfg_.handoff_give_way) {
        way_.start(std::chrono::milliseconds(cfg_.handoff_timeout_ms));
        copies_.d2h_wait_on(way_.word());
      }
      const bool hands_over = in_count == 0 && dev_.peers();  // to the job's processes
      if (hands_over) copies_.keep_d2h_order();               // Note [unmap as copied]
      queue_out_copies();
      if (hands_over) open_sink();
    } catch (...) {  // nothing is unmapped yet: every tag is as it was
      way_.stop();
      try {
        copies_.finish();
      } catch (...) {
      }
      for (outgoing& o : outs_) store_.release(o.extents);
      for (incoming& in : ins_) undo(in);
      throw;
    }
    if (queued) queued();  // Note [early return]: nothing unmapped yet, every copy queued
  }
  try {
    while (out_left() || in_open()) {
      bool progress = false;
      while (out_left() && unmap_next(pending_copies::give_up)) progress = true;
      while (in_open() && map_next()) {
        progress = true;
        // Whatever ran short is mapped now: on the next try, made at once when a run before it
        // had mapped in the same round, not only after a wait step.
        short_ = false;
        mark_if_in_hand();
      }
      if (progress && waiting_ && !short_) {  // the run that waited is mapped
        dev_.peers()->waited(std::chrono::steady_clock::now() - wait_start_, false);
        waiting_ = false;
        trace::counter("peer_wait", 0);
        mark_if_in_hand();
      }
      if (!progress) {
        if (short_) {  // Note [reload waits for peers]
          wait_for_peers_step();
          continue;
        }
        if (awaiting_) {  // Note [handles before creates]
          pump_until_arrival(std::min(
              std::chrono::steady_clock::now() + std::chrono::milliseconds(2), *await_until_));
          continue;
        }
        if (!out_left()) break;  // the in side stopped on a failure
        unmap_next(pending_copies::wait);
      }
    }
  } catch (...) {
    restore_outs();
    throw;
  }
  finish_ins();
}

}  // namespace

namespace {

// Memory recycled but not taken goes back to the driver unless the caller keeps it (Note
// [physical recycling]): through the release queue, held until the unmaps are done, or here with
// TAGMEM_SWAP_RELEASE=inline. Mappings parked ahead are their tags' and stay (Note [mapped
// ahead]). Returns the first failure of a release made here.
CUresult return_unused(device& dev, const config& cfg) noexcept {
  if (cfg.recycle == recycling::keep) return CUDA_SUCCESS;
  if (!cfg.swap_background_release) {
    return dev.recycler().release_now(static_cast<std::size_t>(-1), /*with_ahead=*/false);
  }
  dev.recycler().release_all(dev.releases(), /*with_ahead=*/false);
  return CUDA_SUCCESS;
}

}  // namespace

namespace {

void run_pipeline(device& dev, tag* const* outs, std::size_t out_count, tagmem_offload_mode mode,
                  tag* const* ins, std::size_t in_count, host_store& store, const config& cfg,
                  const std::function<void()>& queued, const mapping_filter* only) {
  // Releases wait until this pipeline's unmaps are done (Note [background release]).
  struct hold_releases {
    release_queue& q;
    explicit hold_releases(release_queue& queue) : q(queue) { q.hold(); }
    ~hold_releases() { q.unhold(); }
  } hold(dev.releases());
  phase_report report(dev, outs, out_count, mode, ins, in_count, store);
  try {
    pipeline p(dev, mode, store, cfg);
    p.set_filter(only);
    try {
      p.run(outs, out_count, ins, in_count, queued);
    } catch (...) {
      return_unused(dev, cfg);
      throw;
    }
    // TAGMEM_SWAP_RELEASE=inline reports a release that fails, as an unmap that released on the
    // spot would; the handle stays kept and the next release tries it again.
    driver::check(return_unused(dev, cfg), "cuMemRelease");
  } catch (const std::exception& e) {
    report.failed(e);
    throw;
  }
}

}  // namespace

void discard_mappings(device& dev, tag& t, const mapping_filter& only, host_store& store,
                      const config& cfg) {
  bool any = false;  // nothing to unmap: no pipeline (it would synchronise the context)
  for (const auto& [va, m] : t.arena().mappings()) any = any || (m.resident && only(va, m.size));
  if (!any) {
    t.set_partially_offloaded(TAGMEM_DISCARD);
    return;
  }
  tag* self = &t;
  run_pipeline(dev, &self, 1, TAGMEM_DISCARD, nullptr, 0, store, cfg, {}, &only);
}

void move_tags(device& dev, tag* const* outs, std::size_t out_count, tagmem_offload_mode mode,
               tag* const* ins, std::size_t in_count, host_store& store, const config& cfg,
               const std::function<void()>& queued) {
  run_pipeline(dev, outs, out_count, mode, ins, in_count, store, cfg, queued, nullptr);
}

}  // namespace tagmem
