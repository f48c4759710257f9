// pause_fault_sweep_test.cpp — every driver call of an NCCL pause and resume fails once, in
// either rank, and nothing is lost.
//
// Two ranks run the shared-buffer scenario (shared_buffers.hpp): local, exported, imported and
// cuMemAlloc buffers, each shared one written by both ranks. A clean pause and resume count the
// driver calls each rank makes in each, per entry point. Then, for each rank, operation, entry
// point and n up to its count, both ranks write fresh random bytes, the chosen rank arms the
// emulator to fail its n-th call of that entry point during the operation (CUDA_ERROR_UNKNOWN),
// and the test asserts:
//  1. each rank's call returned success or an error with a message; a fault that fired while
//     both ranks succeeded is one of the few absorbed by design (absorbable() says why);
//  2. both ranks agree on the outcome and on whether they are paused;
//  3. right after, every buffer is mapped at all its addresses or at none, those mapped hold
//     their bytes, and the stats add up (held = resident + released; the store hands out
//     exactly the backups);
//  4. the retry (resume if paused, else pause and resume) succeeds, every byte of every buffer
//     is back, and nothing leaked: the emulator's live allocations, mappings and pinned host
//     bytes equal those after the clean cycle, and no backup or store extent is held.
// The next round's fresh bytes, written by both ranks into the shared buffers and checked by
// both, prove the ranks still share the same memory. Warm only: the calls a process makes once
// (retaining the primary context, creating the copy stream, pinning the store) are not swept.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "nccl_way.hpp"
#include "peer.hpp"
#include "shared_buffers.hpp"
#include "sweep_stride.hpp"

namespace tagmem::preload_test {
namespace {

const char* const kEntryNames[] = {
#define TAGMEM_DRIVER_ENTRY(name) #name,
#include "driver/entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
};
constexpr std::size_t kEntryCount = sizeof kEntryNames / sizeof kEntryNames[0];

enum op { kPause = 0, kResume = 1 };
const char* op_name(int o) { return o == kPause ? "pause" : "resume"; }

// Failures the shim may absorb, and why; any other fault that fires without an error is a
// defect.
bool absorbable(const std::string& entry) {
  // Restoring the caller's context after the work is done cannot be reported (the operation
  // succeeded); the sweep puts the context back.
  if (entry == "cuCtxSetCurrent") return true;
  // A reference the driver refuses to drop is kept and dropped at the next pause or resume
  // (record_moves.hpp): device memory for a while, no byte and no record affected. The retry
  // and the leak check after it prove it is dropped.
  if (entry == "cuMemRelease") return true;
  return false;
}

struct item {
  int rank, what;
  std::size_t entry;
  std::uint64_t nth;
};

struct totals {
  std::uint64_t runs = 0, fired = 0, errors = 0, absorbed = 0, missed = 0;
};

using counts = std::vector<std::uint64_t>;

// TAGMEM_PAUSE_SWEEP_STRIDE (sweep_stride.hpp) thins each entry point's calls in an operation.
// Both ranks read the same environment, so they build the same schedule.
std::uint64_t sweep_stride() { return test::sweep_stride("TAGMEM_PAUSE_SWEEP_STRIDE"); }
using test::swept;

counts call_counts() {
  counts c(kEntryCount);
  for (std::size_t e = 0; e < kEntryCount; ++e) c[e] = emu_call_count(kEntryNames[e]);
  return c;
}

counts minus(const counts& a, const counts& b) {
  counts d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

scenario_options compact() {
  scenario_options o;
  o.compact = true;
  return o;
}

class sweep {
 public:
  sweep(int rank, control& peer, const std::string& group)
      : me_(rank), peer_(peer), group_(group), sc_(rank, peer, group, compact()) {}

  std::vector<std::string> run() {
    try {
      sc_.setup();
      counts mine[2];
      clean_cycle(0, mine);  // warms up: the calls made once per process are not counted
      clean_cycle(0, mine);
      std::vector<item> schedule = plan(mine);
      for (std::size_t k = 0; k < schedule.size() && problems_ < 20; ++k)
        one(static_cast<int>(k) + 1, schedule[k]);
      sc_.teardown();
      if (me_ == 0) {
        std::printf(
            "[pause fault sweep] runs %llu, faults fired %llu, errors returned %llu, absorbed "
            "%llu, not fired %llu\n",
            static_cast<unsigned long long>(t_.runs), static_cast<unsigned long long>(t_.fired),
            static_cast<unsigned long long>(t_.errors),
            static_cast<unsigned long long>(t_.absorbed),
            static_cast<unsigned long long>(t_.missed));
      }
    } catch (const std::exception& e) {
      failures_.push_back("rank " + std::to_string(me_) + " stopped: " + e.what());
    }
    std::vector<std::string> all = sc_.failures();
    all.insert(all.end(), failures_.begin(), failures_.end());
    return all;
  }

 private:
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    ++problems_;
    failures_.push_back("rank " + std::to_string(me_) + ": " + what);
  }

  tagmem_status call(int what) {
    return what == kPause ? shim().pause(group_.c_str(), me_, 2, 10000)
                          : shim().resume(group_.c_str(), me_, 2, 10000);
  }

  void must(int what, const std::string& context) {
    tagmem_status st = call(what);
    use_device(me_);
    if (st != TAGMEM_SUCCESS)
      throw std::runtime_error(context + ": " + op_name(what) + " failed: " + shim().last_error());
  }

  void clean_cycle(int cycle, counts (&out)[2]) {
    fresh_bytes(cycle);
    for (int what : {kPause, kResume}) {
      counts before = call_counts();
      tagmem_status st = call(what);
      out[what] = minus(call_counts(), before);
      use_device(me_);
      if (st != TAGMEM_SUCCESS)
        throw std::runtime_error(std::string("clean ") + op_name(what) + ": " +
                                 shim().last_error());
    }
    sc_.verify_all(cycle, "after the clean cycle");
    allocations_ = emu_live_allocations();
    mappings_ = emu_live_mappings();
    pinned_ = emu_pinned_host_bytes();
  }

  void fresh_bytes(int cycle) {
    sc_.write_cycle(cycle);
    sc_.step("written", cycle);
    sc_.verify_all(cycle, "before the operation");
    sc_.step("verified", cycle);
  }

  // Both ranks learn both ranks' counts and build the same schedule.
  std::vector<item> plan(const counts (&mine)[2]) {
    std::ostringstream out;
    for (int what : {kPause, kResume})
      for (std::uint64_t n : mine[what]) out << n << " ";
    peer_.send(out.str());
    std::istringstream in(peer_.receive(nullptr, 30000));
    counts theirs[2] = {counts(kEntryCount), counts(kEntryCount)};
    for (int what : {kPause, kResume})
      for (std::uint64_t& n : theirs[what]) in >> n;
    std::vector<item> schedule;
    const std::uint64_t stride = sweep_stride();
    for (int rank : {0, 1}) {
      const counts* table = rank == me_ ? mine : theirs;
      for (int what : {kPause, kResume})
        for (std::size_t e = 0; e < kEntryCount; ++e)
          for (std::uint64_t n = 1; n <= table[what][e]; ++n)
            if (swept(n, table[what][e], stride)) schedule.push_back({rank, what, e, n});
    }
    return schedule;
  }

  void one(int cycle, const item& it) {
    const std::string name = std::string(op_name(it.what)) + " with call " +
                             std::to_string(it.nth) + " of " + kEntryNames[it.entry] +
                             " failing in rank " + std::to_string(it.rank) + ", round " +
                             std::to_string(cycle);
    fresh_bytes(cycle);
    if (it.what == kResume) must(kPause, name + " (the clean pause before)");
    const bool armed = it.rank == me_;
    std::uint64_t before = 0;
    if (armed) {
      before = emu_call_count(kEntryNames[it.entry]);
      emu_fail_call(kEntryNames[it.entry], it.nth, CUDA_ERROR_UNKNOWN);
    }
    tagmem_status st = call(it.what);
    std::string message = st == TAGMEM_SUCCESS ? "" : shim().last_error();
    bool fired = armed && emu_call_count(kEntryNames[it.entry]) - before >= it.nth;
    if (armed) emu_clear_faults();
    use_device(me_);
    tagmem_nccl_stats s = shim_stats();

    // Both ranks' outcomes.
    peer_.send(std::to_string(st) + " " + std::to_string(s.paused) + " " + (fired ? "1" : "0"));
    std::istringstream in(peer_.receive(nullptr, 30000));
    int their_status = 0, their_paused = 0, their_fired = 0;
    in >> their_status >> their_paused >> their_fired;
    const bool any_fired = fired || their_fired;
    const bool both_ok = st == TAGMEM_SUCCESS && their_status == TAGMEM_SUCCESS;
    if (me_ == 0) {
      ++t_.runs;
      if (any_fired) ++t_.fired;
      if (!any_fired) ++t_.missed;
      if (!both_ok) ++t_.errors;
      if (any_fired && both_ok) ++t_.absorbed;
    }
    expect(!armed || fired,
           name + ": the fault did not fire (the calls differ from the clean run)");
    expect(st == TAGMEM_SUCCESS || !message.empty(), name + ": an error without a message");
    expect((st == TAGMEM_SUCCESS) == (their_status == TAGMEM_SUCCESS),
           name + ": the ranks disagree on the outcome (" + std::to_string(st) + " here, " +
               std::to_string(their_status) + " there; " + message + ")");
    expect(s.paused == their_paused, name + ": the ranks disagree on being paused");
    if (armed && fired && both_ok)
      expect(absorbable(kEntryNames[it.entry]), name + ": the failure was not reported");
    expect(s.held_bytes == s.resident_bytes + s.released_bytes,
           name + ": held != resident + released");
    expect(s.backup_store_used_bytes == s.backup_bytes,
           name + ": the store hands out " + std::to_string(s.backup_store_used_bytes) +
               " bytes, the records hold backups of " + std::to_string(s.backup_bytes));
    sc_.verify_whole_or_gone(cycle, "right after " + name);
    sc_.step("checked", cycle);

    // The retry, as a caller would make it.
    if (s.paused) {
      must(kResume, name + " (the retry)");
    } else if (it.what == kPause || fired || their_fired) {
      must(kPause, name + " (the retry)");
      must(kResume, name + " (the retry)");
    }
    sc_.verify_all(cycle, "after the retry of " + name);
    s = shim_stats();
    expect(s.paused == 0 && s.released_bytes == 0 && s.backup_bytes == 0 &&
               s.backup_store_used_bytes == 0,
           name + ": after the retry something is still released or backed up");
    expect(emu_live_allocations() == allocations_ && emu_live_mappings() == mappings_,
           name + ": leaked: " + std::to_string(emu_live_allocations()) + " allocations, " +
               std::to_string(emu_live_mappings()) + " mappings against " +
               std::to_string(allocations_) + " and " + std::to_string(mappings_));
    expect(emu_pinned_host_bytes() == pinned_, name + ": pinned host bytes " +
                                                   std::to_string(emu_pinned_host_bytes()) +
                                                   " against " + std::to_string(pinned_));
    sc_.step("retried", cycle);
  }

  int me_;
  control& peer_;
  std::string group_;
  shared_scenario sc_;
  std::vector<std::string> failures_;
  int problems_ = 0;
  std::uint64_t allocations_ = 0, mappings_ = 0, pinned_ = 0;
  totals t_;
};

TAGMEM_PEER_SCENARIO(pause_sweep_rank1) {
  std::vector<std::string> failures = sweep(1, args.channel, args.group).run();
  for (const auto& f : failures) std::fprintf(stderr, "[peer] %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

TEST(PauseFaultSweep, EveryDriverCallOfPauseAndResumeFailingInEitherRankLosesNothing) {
  std::string group = unique_group("sweep");
  peer_process peer("pause_sweep_rank1", group);
  std::vector<std::string> failures = sweep(0, peer.channel(), group).run();
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(peer.wait(600000), 0) << "rank 1's checks failed (its messages are on stderr)";
}

}  // namespace
}  // namespace tagmem::preload_test
