// fault_sweep_test.cpp — every driver call of a cycle fails once, and nothing is lost.
//
// For a cycle (fault_cycle.hpp) the emulator counts the driver calls of one clean run; then, for
// each N, a fresh tagmem runs the cycle with the N-th call failing, and the test asserts:
//  1. the step that made the call returned an error status with a message (DRIVER, or
//     OUT_OF_MEMORY / HOST_OUT_OF_MEMORY for an injected CUDA_ERROR_OUT_OF_MEMORY), never a crash;
//  2. every allocation of a resident tag still holds its bytes, right after the failure;
//  3. finishing the failed step without the fault succeeds, and so does the rest of the cycle,
//     with every BACKUP byte checked wherever its tag went (offloaded tags are checked when the
//     cycle reloads them);
//  4. nothing leaks: after the cycle and a host-store trim the emulator's live objects equal
//     those of a clean run, and after tagmem_shutdown those from before tagmem_init.
// Sweeps run "cold" (the cycle right after tagmem_init, device set-up included, the calling
// thread without a current context) and "warm" (after one clean cycle, the thread in the
// device's primary context, as in a PyTorch process). The any-call sweep injects a generic
// error (CUDA_ERROR_UNKNOWN) at every N; the per-entry sweeps inject CUDA_ERROR_OUT_OF_MEMORY at
// every call of each entry point of the data path, and check the message names it
// (TAGMEM_FAULT_SWEEP=full: every entry point, and CUDA_ERROR_INVALID_VALUE too); the clock-page
// sweep does so with the release clock's page in each state another process may leave it in
// (clock_page_state.hpp). Under a sanitizer, TAGMEM_FAULT_SWEEP_STRIDE thins each sweep's calls
// (sweep_stride.hpp). A few failures are absorbed by design (absorbable() says which and why).
// Figures are printed for docs/reliability.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "clock_page_state.hpp"
#include "driver/driver.hpp"
#include "emu_controls.hpp"
#include "fault_cycle.hpp"
#include "sweep_stride.hpp"

namespace tagmem::reliability {
namespace {

using test::sweep_stride;
using test::swept;

// Failures tagmem may absorb without returning an error, and why. Anything else that fails
// and is not reported is a defect.
bool absorbable(const char* entry, CUresult error, fault_cycle::kind step) {
  const std::string e = entry;
  // context_guard's destructor restores the caller's context and cannot report failing to (it
  // runs after the operation succeeded): the caller is left with tagmem's context current. The
  // sweep puts the context back.
  if (e == "cuCtxSetCurrent") return true;
  // In a swap, an in-run that finds no device memory waits for the out side to unmap more and
  // tries again (Note [unmap as copied] in offload_engine.cpp): out of memory is not a failure
  // while out-mappings remain.
  if (step == fault_cycle::kind::swap && error == CUDA_ERROR_OUT_OF_MEMORY &&
      (e == "cuMemCreate" || e == "cuMemMap" || e == "cuMemSetAccess")) {
    return true;
  }
  return false;
}

const char* const kEntryNames[] = {
#define TAGMEM_DRIVER_ENTRY(name) #name,
#include "entry_points.def"
#undef TAGMEM_DRIVER_ENTRY
};

constexpr std::size_t kEntryCount = sizeof kEntryNames / sizeof kEntryNames[0];

struct run_report {
  bool fired = false;
  bool absorbed = false;             // fired, yet no step failed
  std::string problem;               // "" when every assertion held
  std::string failure;               // the failed step and tagmem's message
  std::vector<std::uint64_t> calls;  // per entry point, during the cycle's steps
  std::uint64_t reached = 0;         // calls of the faulted entry (of any when null) made
};

// Note [call counts vary]: how often the offload pipeline polls and waits for its copies
// (cuEventQuery, cuEventSynchronize, and the context switches around them) depends on when the
// copies finish, so a run may make fewer calls than the clean one, and a fault beyond its last
// call does not fire. Such a miss is explained; a fault that did not fire although the run
// reached its call means the injection is broken. A sweep must still fire most of its faults.
struct miss_count {
  std::uint64_t attempts = 0, fired = 0, beyond_the_run = 0, unexplained = 0;
  void add(const run_report& r, std::uint64_t nth) {
    ++attempts;
    if (r.fired) {
      ++fired;
    } else if (r.reached < nth) {
      ++beyond_the_run;
    } else {
      ++unexplained;
    }
  }
};

struct sweep_totals {
  std::uint64_t runs = 0, fired = 0, errors = 0, absorbed = 0, bytes_verified = 0;
};
sweep_totals g_totals;

std::vector<std::uint64_t> call_counts() {
  std::vector<std::uint64_t> out(kEntryCount);
  for (std::size_t e = 0; e < kEntryCount; ++e) out[e] = emu().call_count(kEntryNames[e]);
  return out;
}

// The message of the failed step (fault_cycle::last_error()), for check_failure().
std::string g_last_error;

class FaultSweep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Small pinned slabs make the host store grow (and pin) several times per cycle, so
    // cuMemHostRegister is part of the sweep.
    setenv("TAGMEM_HOST_SLAB_BYTES", "2M", 1);
    setenv("TAGMEM_METADATA", "system", 0);
    // The N-th driver call must be the same call in every run: releases stay on this thread
    // (the background release, of DISCARD offloads and of swaps, has its tests in tests/core).
    setenv("TAGMEM_DISCARD_RELEASE", "wait", 1);
    setenv("TAGMEM_SWAP_RELEASE", "inline", 1);
  }
  static void TearDownTestSuite() {
    std::printf(
        "[fault sweep] cycles %llu, injected faults fired %llu, errors returned %llu, "
        "absorbed %llu, bytes verified %llu\n",
        static_cast<unsigned long long>(g_totals.runs),
        static_cast<unsigned long long>(g_totals.fired),
        static_cast<unsigned long long>(g_totals.errors),
        static_cast<unsigned long long>(g_totals.absorbed),
        static_cast<unsigned long long>(g_totals.bytes_verified));
  }

  void SetUp() override {
    ASSERT_TRUE(emu().available) << "the fault sweep needs TAGMEM_LIBCUDA=libtagmem_emu.so";
    emu().clear_faults();
    tagmem_config_init(&cfg_);
    cfg_.copy_piece_bytes = 4u << 20;  // several copies per tag
  }

  // Runs one cycle from a fresh tagmem with the `nth` call of `entry` (of any entry point when
  // null; no fault when nth is 0) failing with `error`, and checks 1-4 of the file comment.
  run_report run(bool warm, const char* entry, std::uint64_t nth, CUresult error) {
    run_report r;
    auto problem = [&](const std::string& what) {
      if (r.problem.empty()) r.problem = what;
    };
    const emu_census before_init = take_census();
    if (tagmem_init(&cfg_) != TAGMEM_SUCCESS) {
      r.problem = std::string("tagmem_init: ") + tagmem_last_error();
      return r;
    }
    const auto& api = driver::api();
    CUdevice dev = 0;
    api.cuDeviceGet(&dev, 0);
    CUcontext thread_context = nullptr;
    if (warm) {
      api.cuDevicePrimaryCtxRetain(&thread_context, dev);
      api.cuCtxSetCurrent(thread_context);
      fault_cycle clean(42);
      for (std::size_t i = 0; i < clean.steps().size(); ++i) {
        if (clean.run(i) != TAGMEM_SUCCESS) problem("warm-up: " + clean.describe(i) + " failed");
      }
    }
    api.cuCtxSetCurrent(thread_context);
    // Planted anew for each run: the runs' own releases move a page's clock on.
    if (clock_ != test::clock_page_state::none) test::use_clock_page(clock_);

    fault_cycle cycle(nth * 7919 + (warm ? 1 : 0));
    const std::uint64_t calls_before = emu().call_count(entry);
    const std::vector<std::uint64_t> counts_before = call_counts();
    if (nth) emu().fail_call(entry, nth, error);
    const std::size_t steps = cycle.steps().size();
    std::size_t i = 0;
    for (; i < steps && r.problem.empty(); ++i) {
      const bool fired_before = r.fired;
      const tagmem_status s = cycle.run(i);
      r.fired = nth && emu().call_count(entry) - calls_before >= nth;
      if (s != TAGMEM_SUCCESS) {
        r.failure = cycle.describe(i) + ": " + cycle.last_error();
        g_last_error = cycle.last_error();
        check_failure(s, entry, error, r.fired && !fired_before, cycle.describe(i), problem);
        break;
      }
      if (r.fired && !fired_before) {
        r.absorbed = true;
        if (entry && !absorbable(entry, error, cycle.steps()[i].what)) {
          problem(std::string("a failing ") + entry + " during " + cycle.describe(i) +
                  " was not reported");
        }
        api.cuCtxSetCurrent(thread_context);  // see absorbable()
      }
      cycle.settle();
      if (auto bad = cycle.check_bytes(); !bad.empty()) {
        problem("after " + cycle.describe(i) + ": " + bad);
      }
    }
    const std::vector<std::uint64_t> counts_after = call_counts();
    for (std::size_t e = 0; e < kEntryCount; ++e) {
      r.calls.push_back(counts_after[e] - counts_before[e]);
    }
    r.reached = emu().call_count(entry) - calls_before;
    emu().clear_faults();
    CUcontext current = nullptr;
    api.cuCtxGetCurrent(&current);
    if (current != thread_context) problem("tagmem changed the calling thread's context");
    if (i < steps && r.problem.empty()) {
      // 2: bytes of resident tags right after the failure; 3: finish the step and the cycle.
      cycle.settle();
      if (auto bad = cycle.check_bytes(); !bad.empty()) problem("right after the fault: " + bad);
      if (auto bad = cycle.complete(i); !bad.empty()) problem(bad);
      cycle.settle();
      if (auto bad = cycle.check_bytes(); !bad.empty()) problem("after the retry: " + bad);
      for (++i; i < steps && r.problem.empty(); ++i) {
        if (cycle.run(i) != TAGMEM_SUCCESS) {
          problem("after the retry, " + cycle.describe(i) + " failed: " + cycle.last_error());
        }
        cycle.settle();
        if (auto bad = cycle.check_bytes(); !bad.empty()) {
          problem("after " + cycle.describe(i) + ": " + bad);
        }
      }
    }
    g_totals.bytes_verified += cycle.bytes_verified();
    if (CUresult sticky = emu().sticky_error(0); sticky != CUDA_SUCCESS) {
      // An asynchronous copy touched memory that was no longer mapped: an ordering bug.
      problem("a copy faulted and poisoned the context (sticky CUresult " + std::to_string(sticky) +
              ")");
      emu().clear_sticky_error(0);
    }
    // 4: nothing left behind by the cycle, and nothing at all after shutdown.
    if (tagmem_host_trim(0) != TAGMEM_SUCCESS) problem(std::string("trim: ") + tagmem_last_error());
    emu_census after_cycle = take_census();
    // Events are pooled by the device and a failure path may have needed one more than the
    // clean run; a device whose copy kernel failed to load goes on without it and its stream
    // (Note [copy kernel]). Both are checked after shutdown, when the device is gone.
    after_cycle.events = 0;
    after_cycle.streams = 0;
    if (!reference_.count(warm)) {
      reference_[warm] = after_cycle;  // the first (clean) run defines what a cycle leaves
    } else if (!(after_cycle == reference_[warm])) {
      problem("leak after the cycle: " + describe_difference(reference_[warm], after_cycle));
    }
    if (after_cycle.device_used[0] || after_cycle.mappings || after_cycle.allocations ||
        after_cycle.pinned_host_bytes || after_cycle.host_registrations) {
      problem("memory held after freeing everything and trimming: " +
              describe_difference(emu_census{}, after_cycle));
    }
    if (tagmem_shutdown() != TAGMEM_SUCCESS)
      problem(std::string("shutdown: ") + tagmem_last_error());
    if (warm) {
      api.cuCtxSetCurrent(nullptr);
      api.cuDevicePrimaryCtxRelease(dev);
    }
    const emu_census after_shutdown = take_census();
    if (!(after_shutdown == before_init)) {
      problem("leak after shutdown: " + describe_difference(before_init, after_shutdown));
    }
    ++g_totals.runs;
    g_totals.fired += r.fired;
    g_totals.absorbed += r.absorbed;
    return r;
  }

  template <class P>
  void check_failure(tagmem_status s, const char* entry, CUresult error, bool fired_here,
                     const std::string& step, P& problem) {
    const std::string message = g_last_error;
    if (!fired_here) {
      problem(step + " failed without an injected fault: " + tagmem_status_string(s) + ": " +
              message);
      return;
    }
    ++g_totals.errors;
    const bool ok_status =
        error == CUDA_ERROR_OUT_OF_MEMORY
            ? (s == TAGMEM_ERROR_OUT_OF_MEMORY || s == TAGMEM_ERROR_HOST_OUT_OF_MEMORY)
            : s == TAGMEM_ERROR_DRIVER;
    if (!ok_status) {
      problem(step + " returned " + tagmem_status_string(s) + " for an injected CUresult " +
              std::to_string(error) + ": " + message);
    }
    if (message.empty()) problem(step + " failed without a message");
    if (entry && message.find(entry) == std::string::npos) {
      problem(step + ": the message does not name " + entry + ": " + message);
    }
  }

  // The any-call sweep: every call of the cycle fails once with CUDA_ERROR_UNKNOWN.
  void sweep_every_call(bool warm) {
    const run_report clean = run(warm, nullptr, 0, CUDA_SUCCESS);
    ASSERT_EQ(clean.problem, "") << "the clean cycle itself failed";
    std::uint64_t total = 0;
    for (std::uint64_t c : clean.calls) total += c;
    ASSERT_GT(total, 20u);
    miss_count misses;
    const std::uint64_t stride = sweep_stride("TAGMEM_FAULT_SWEEP_STRIDE");
    for (std::uint64_t n = 1; n <= total; ++n) {
      if (!swept(n, total, stride)) continue;
      run_report r = run(warm, nullptr, n, CUDA_ERROR_UNKNOWN);
      misses.add(r, n);
      EXPECT_EQ(r.problem, "") << "call " << n << " of " << total << " failing (" << r.failure
                               << ")";
    }
    // Note [call counts vary]
    EXPECT_EQ(misses.unexplained, 0u) << "faults that never fired within the run's calls";
    EXPECT_GE(misses.fired * 2, misses.attempts)
        << "fewer than half of " << misses.attempts << " faults fired";
    std::printf(
        "[fault sweep] %s cycle: %llu driver calls, %llu of them failed once (stride %llu; %llu "
        "beyond the end of a shorter run)\n",
        warm ? "warm" : "cold", static_cast<unsigned long long>(total),
        static_cast<unsigned long long>(misses.attempts), static_cast<unsigned long long>(stride),
        static_cast<unsigned long long>(misses.beyond_the_run));
  }

  // The per-entry sweeps: every call of each listed entry point (every entry point the cycle
  // uses when `entries` is empty) fails once with each of `errors`. Returns the clean run's report.
  run_report sweep_entries(bool warm, const std::vector<std::string>& entries,
                           const std::vector<CUresult>& errors) {
    const run_report clean = run(warm, nullptr, 0, CUDA_SUCCESS);
    EXPECT_EQ(clean.problem, "") << "the clean cycle itself failed";
    if (!clean.problem.empty()) return clean;
    miss_count all;
    const std::uint64_t stride = sweep_stride("TAGMEM_FAULT_SWEEP_STRIDE");
    for (std::size_t e = 0; e < kEntryCount; ++e) {
      const char* entry = kEntryNames[e];
      if (!entries.empty() && std::find(entries.begin(), entries.end(), entry) == entries.end()) {
        continue;
      }
      const std::uint64_t calls = clean.calls[e];
      // Warm, the arena and host store exist already; and whether the pipeline polls or waits for
      // its copies at all depends on when they finish (Note [call counts vary]).
      const bool timed =
          std::strcmp(entry, "cuEventSynchronize") == 0 || std::strcmp(entry, "cuEventQuery") == 0;
      if (!entries.empty() && !warm && !timed) {
        EXPECT_GT(calls, 0u) << "the cycle never calls " << entry;
      }
      miss_count misses;
      for (std::uint64_t n = 1; n <= calls; ++n) {
        if (!swept(n, calls, stride)) continue;
        for (CUresult error : errors) {
          run_report r = run(warm, entry, n, error);
          misses.add(r, n);
          EXPECT_EQ(r.problem, "")
              << entry << " call " << n << " of " << calls << " failing with CUresult " << error
              << " (" << r.failure << ")";
        }
      }
      // Note [call counts vary]
      EXPECT_EQ(misses.unexplained, 0u)
          << "faults of " << entry << " that never fired within the run's calls";
      all.attempts += misses.attempts;
      all.fired += misses.fired;
      if (calls) {
        std::printf(
            "[fault sweep] %s cycle: %-22s %3llu calls x %zu errors (%llu beyond the run)\n",
            warm ? "warm" : "cold", entry, static_cast<unsigned long long>(calls), errors.size(),
            static_cast<unsigned long long>(misses.beyond_the_run));
      }
    }
    EXPECT_GE(all.fired * 2, all.attempts)
        << "fewer than half of " << all.attempts << " faults fired";
    return clean;
  }

  void TearDown() override { test::use_clock_page(test::clock_page_state::none); }

  tagmem_config cfg_{};
  test::clock_page_state clock_ = test::clock_page_state::none;  // planted before each run
  std::map<bool, emu_census> reference_;
};

TEST_F(FaultSweep, EveryDriverCallOfAColdCycleFailsCleanly) { sweep_every_call(false); }

TEST_F(FaultSweep, EveryDriverCallOfAWarmCycleFailsCleanly) { sweep_every_call(true); }

// The entry points the cycle's data path depends on, each failing at every one of its calls.
const std::vector<std::string> kNamedEntries = {
    "cuMemCreate",       "cuMemMap",           "cuMemSetAccess", "cuMemcpyDtoHAsync",
    "cuMemcpyHtoDAsync", "cuMemUnmap",         "cuMemRelease",   "cuStreamSynchronize",
    "cuMemHostRegister", "cuCtxSynchronize",   "cuEventRecord",  "cuEventSynchronize",
    "cuEventQuery",      "cuMemAddressReserve"};

// TAGMEM_FAULT_SWEEP: "quick" runs the two any-call sweeps only (each already fails every call
// of its cycle once; the sanitizer builds use it), "full" adds every entry point; the default
// runs the any-call and the named-entry sweeps.
bool sweep_level_at_least(const char* wanted) {
  const char* level = std::getenv("TAGMEM_FAULT_SWEEP");
  const std::string have = level && *level ? level : "standard";
  auto rank = [](const std::string& l) { return l == "quick" ? 0 : l == "full" ? 2 : 1; };
  return rank(have) >= rank(wanted);
}

TEST_F(FaultSweep, NamedEntryPointsFailCleanlyAtEveryCallCold) {
  if (!sweep_level_at_least("standard")) GTEST_SKIP() << "TAGMEM_FAULT_SWEEP=quick";
  sweep_entries(false, kNamedEntries, {CUDA_ERROR_OUT_OF_MEMORY});
}

TEST_F(FaultSweep, NamedEntryPointsFailCleanlyAtEveryCallWarm) {
  if (!sweep_level_at_least("standard")) GTEST_SKIP() << "TAGMEM_FAULT_SWEEP=quick";
  sweep_entries(true, kNamedEntries, {CUDA_ERROR_OUT_OF_MEMORY});
}

// The release clock's page in each state another process may leave it in (Note [clock page]).
// Holding a hostile value, it sends each reload's host-to-device copies to the copy kernel too
// (with pieces small enough that the copy engines' lanes fill up), so the kernel's launches fail
// at each call as well. Fresh or truncated, it is read and written by the releases and reloads
// that fail. Whatever the state, nothing is lost.
TEST_F(FaultSweep, TheDataPathFailsCleanlyWithEachStateOfTheClockPage) {
  if (!sweep_level_at_least("standard")) GTEST_SKIP() << "TAGMEM_FAULT_SWEEP=quick";
  const std::size_t launch =
      std::find_if(kEntryNames, kEntryNames + kEntryCount,
                   [](const char* e) { return std::strcmp(e, "cuLaunchKernel") == 0; }) -
      kEntryNames;
  ASSERT_LT(launch, kEntryCount);
  using test::clock_page_state;
  for (const auto state :
       {clock_page_state::hostile, clock_page_state::fresh, clock_page_state::truncated}) {
    SCOPED_TRACE("clock page state " + std::to_string(static_cast<int>(state)));
    clock_ = state;
    reference_.clear();
    const bool hostile = state == clock_page_state::hostile;
    cfg_.copy_piece_bytes = hostile ? 1u << 20 : 4u << 20;
    const run_report clean = sweep_entries(
        true,
        hostile ? std::vector<std::string>{"cuLaunchKernel", "cuMemcpyHtoDAsync", "cuMemRelease"}
                : std::vector<std::string>{"cuMemRelease", "cuMemcpyHtoDAsync"},
        {CUDA_ERROR_OUT_OF_MEMORY});
    if (hostile) {
      EXPECT_GT(clean.calls[launch], 0u) << "a hostile page did not send copies to the kernel";
    } else {
      EXPECT_EQ(clean.calls[launch], 0u) << "the kernel ran without a release that counts";
    }
  }
}

// Every entry point the cycle calls, both errors, both modes: about four times the work of the
// named sweeps, so only with TAGMEM_FAULT_SWEEP=full (docs/reliability.md).
TEST_F(FaultSweep, EveryEntryPointFailsCleanlyAtEveryCall) {
  if (!sweep_level_at_least("full")) {
    GTEST_SKIP() << "set TAGMEM_FAULT_SWEEP=full to sweep every entry point";
  }
  sweep_entries(false, {}, {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE});
  sweep_entries(true, {}, {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE});
}

}  // namespace
}  // namespace tagmem::reliability
