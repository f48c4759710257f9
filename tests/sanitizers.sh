#!/usr/bin/env bash
# Sanitizers and the bounded fuzzer run, on the emulated driver (docs/reliability.md).
#
# 1. AddressSanitizer + UndefinedBehaviorSanitizer build (clang 14, -fno-sanitize-recover=all via
#    TAGMEM_SANITIZE): the emulator test suites (ctest -L emu) of every target it builds, the
#    LD_PRELOAD shim's included (every process they start is an instrumented binary of the tree),
#    with the shim's fuzz tests run with fixed seeds: TAGMEM_CALLS_FUZZ_STEPS (100) steps per
#    thread of runtime and driver calls, TAGMEM_SETTINGS_FUZZ_ROUNDS (10) processes started with
#    random settings, TAGMEM_PEER_FUZZ_ROUNDS (20) pauses and resumes with a rank that lies; the
#    fault sweeps thinned (TAGMEM_FAULT_SWEEP=quick with TAGMEM_FAULT_SWEEP_STRIDE=4, and
#    TAGMEM_PAUSE_SWEEP_STRIDE=32: tests/faults/sweep_stride.hpp).
# 2. The state-machine fuzzer, built in the same tree, for TAGMEM_FUZZ_SECONDS (60); then the
#    rendezvous message fuzzer for TAGMEM_RDV_FUZZ_SECONDS (30). Longer runs, by hand, are where
#    the fuzzers explore (docs/reliability.md); CI's runs keep the gate quick.
# 3. ThreadSanitizer build: the threaded tests (Threads.*, Release.*, EmulatorRelease.*, background
#    pinning, StreamReuse.*, the recycler shared with the release thread and the pin-ahead thread
#    (one test of each interplay: see the filter), Stress.*, EmulatorStress.*, replicas offloading
#    one after the other with the thread that waits for the other shares, handed memory mapped
#    ahead by the registry's thread), and the shim's
#    suite (preload_emu: NCCL pauses and resumes of several ranks beside interposed driver calls,
#    thread exits, the settings and peer fuzz tests with fixed seeds) and its threads of runtime
#    and driver calls (preload_calls_fuzz_emu, TAGMEM_CALLS_FUZZ_STEPS 100).
# Any failing test, any sanitizer report (also one that a test somehow survived) and any fuzzer
# finding fails the script. Build trees go under <build-root> (default: build-san/ in the repo).
#
# Usage: bash tests/sanitizers.sh [build-root]
# Env:   TAGMEM_SAN_JOBS (build and test parallelism, default nproc), TAGMEM_FUZZ_SECONDS (60),
#        TAGMEM_SAN_SKIP=asan,fuzz,tsan (parts to leave out), TAGMEM_SAN_TARGETS (extra targets
#        for the ASan tree, e.g. other emu-labelled test binaries).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-$repo/build-san}
jobs=${TAGMEM_SAN_JOBS:-$(nproc)}
skip=${TAGMEM_SAN_SKIP:-}
export CC=${CC:-clang} CXX=${CXX:-clang++}
mkdir -p "$root"
summary=()
failed=0

# A sanitizer report in any log is a failure even if the process exit status hid it.
scan() {
  if grep -nE "ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:|SUMMARY: (Address|Undefined|Thread)" "$1" | head -20; then
    echo "[sanitizers] sanitizer report in $1"
    return 1
  fi
}

# libtagmem_emu.so and libtagmem.so link with --no-undefined, which an instrumented shared object
# cannot pass: the sanitizer runtime is linked into the executable, which provides its symbols at
# run time. CMAKE_<LANG>_STANDARD_LIBRARIES come last on every link line, so -z undefs there
# overrides it for the sanitizer builds only. (A shared runtime, -shared-libsan, is no way out:
# ThreadSanitizer's crashes at start-up here, and libFuzzer puts libstdc++ before ASan's.)
configure() {  # <dir> <sanitizers> [cmake args...]
  local dir=$1 san=$2
  shift 2
  # Line tables only: a report still names files and lines, and the two trees build faster (the
  # ABI check, which needs full type information, runs in the plain build).
  cmake -S "$repo" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
    -DTAGMEM_SANITIZE="$san" -DTAGMEM_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CXX_STANDARD_LIBRARIES=-Wl,-z,undefs -DCMAKE_C_STANDARD_LIBRARIES=-Wl,-z,undefs \
    "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
}

# Targets that exist in a configured tree, out of the candidates given.
existing_targets() {  # <dir> <target...>
  local dir=$1
  shift
  local all
  all=$(ninja -C "$dir" -t targets all 2>/dev/null | sed 's/:.*//')
  for t in "$@"; do
    if grep -qx "$t" <<<"$all"; then echo "$t"; fi
  done
}

# Names of the emu-labelled tests whose executables were built (others are listed, not hidden).
built_emu_tests() {  # <dir>
  (cd "$1" && ctest -L emu --show-only=json-v1) | python3 -c '
import json, os, re, sys
run, skipped = [], []
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    # The program, and any program of this tree a script runs, must have been built.
    tree = os.path.realpath(sys.argv[1]) + os.sep
    outputs = [a for a in cmd[1:] if os.path.realpath(a).startswith(tree)]
    built = (cmd and os.path.exists(cmd[0]) and all(os.path.exists(a) for a in outputs)
             and not t["name"].endswith("_NOT_BUILT"))
    (run if built else skipped).append(t["name"])
sys.stderr.write("[sanitizers] emu tests not built in this tree, not run: %s\n"
                 % (", ".join(sorted(set(skipped))) or "none"))
print("^(" + "|".join(re.escape(n) for n in run) + ")$" if run else "^$")
' "$1"
}

common_env() {
  export TAGMEM_METADATA=system  # tagmem's records in malloc, where the sanitizers see them
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
}

# The shim's fuzz tests with fixed seeds, so that the gate passes or fails the same way on the
# same code (give other seeds, and more steps, to explore); given to the ASan and the TSan runs.
shim_fuzz_env=(
  TAGMEM_CALLS_FUZZ_STEPS="${TAGMEM_CALLS_FUZZ_STEPS:-100}"
  TAGMEM_CALLS_FUZZ_SEED="${TAGMEM_CALLS_FUZZ_SEED:-1}"
  TAGMEM_SETTINGS_FUZZ_ROUNDS="${TAGMEM_SETTINGS_FUZZ_ROUNDS:-10}"
  TAGMEM_SETTINGS_FUZZ_SEED="${TAGMEM_SETTINGS_FUZZ_SEED:-1}"
  TAGMEM_PEER_FUZZ_ROUNDS="${TAGMEM_PEER_FUZZ_ROUNDS:-20}"
  TAGMEM_PEER_FUZZ_SEED="${TAGMEM_PEER_FUZZ_SEED:-1}"
)

# ---- 1. ASan + UBSan -------------------------------------------------------------------------
asan=$root/address
if [[ ",$skip," != *",asan,"* || ",$skip," != *",fuzz,"* ]]; then
  start=$SECONDS
  fuzz_flag=OFF
  [[ ",$skip," != *",fuzz,"* ]] && fuzz_flag=ON
  configure "$asan" address,undefined -DTAGMEM_BUILD_FUZZERS=$fuzz_flag
  mapfile -t targets < <(existing_targets "$asan" tagmem_emu tagmem_emu_tests tagmem_core_tests \
    tagmem_fault_tests tagmem_fuzz_replay_tests tagmem_stress_tests tagmem_exit_probe \
    tagmem_protocol_tests tagmem_rendezvous_fuzz_replay \
    tagmem_fuzz_state_machine tagmem_fuzz_rendezvous \
    tagmem_preload tagmem_preload_tests tagmem_claim_forger tagmem_inconsistent_peer \
    tagmem_gpa_forwarder \
    tagmem_metadata_heap_high_address tagmem_host_budget_probe tagmem_torch_entry_tests \
    tagmem_handoff_tests tagmem_ipc_tests tagmem_ipc_shim_test tagmem_thread_exit_c \
    ${TAGMEM_SAN_TARGETS:-})
  ninja -C "$asan" -j "$jobs" "${targets[@]}" >"$asan.build.log" 2>&1 ||
    { tail -50 "$asan.build.log"; exit 1; }
  summary+=("asan+ubsan build: ${#targets[@]} targets in $((SECONDS - start))s")
fi

if [[ ",$skip," != *",asan,"* ]]; then
  start=$SECONDS
  common_env
  # intercept_tls_get_addr=0: clang 14's runtime (fixed in LLVM 17) can take a dynamic TLS block
  # for one with a pre-2.25 glibc header when its address happens to sit at a certain page
  # offset; LeakSanitizer's exit scan then reads a bogus range and crashes ("Tracer caught
  # signal 11") after every test passed. Which binary it hits depends on layout alone: adding
  # tests to a suite can make it hit on every run.
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:intercept_tls_get_addr=0
  # The driver-call fault sweeps: the any-call sweeps only, failing the first, the last and every
  # 4th call of each cycle (tests/faults/sweep_stride.hpp; the plain build fails every call).
  export TAGMEM_FAULT_SWEEP=${TAGMEM_FAULT_SWEEP:-quick}
  export TAGMEM_FAULT_SWEEP_STRIDE=${TAGMEM_FAULT_SWEEP_STRIDE:-4}
  # The NCCL pause/resume fault sweep fails the first, the last and every 32nd call of each entry
  # point (all of them take more than 15 minutes under ASan; the plain build sweeps every call).
  export TAGMEM_PAUSE_SWEEP_STRIDE=${TAGMEM_PAUSE_SWEEP_STRIDE:-32}
  filter=$(built_emu_tests "$asan")
  # Left out (the plain build runs it): abi_baseline_emu compares libtagmem's types with the
  # stored baseline.
  echo "[sanitizers] left out of the ASan run: abi_baseline_emu"
  log=$asan/ctest-emu.log
  if (cd "$asan" && env "${shim_fuzz_env[@]}" ctest -L emu -R "$filter" \
        -E '^(abi_baseline_emu)$' -j "$jobs" \
        --timeout 1200 --output-on-failure \
        --output-log "$log" >"$asan.ctest.out" 2>&1) && scan "$log"; then
    summary+=("asan+ubsan: $(grep -E 'tests passed' "$asan.ctest.out" | tail -1) in $((SECONDS - start))s")
  else
    tail -60 "$asan.ctest.out"
    summary+=("asan+ubsan: FAILED (see $asan.ctest.out, $log)")
    failed=1
  fi
  unset TAGMEM_FAULT_SWEEP TAGMEM_FAULT_SWEEP_STRIDE
fi

# ---- 2. the fuzzer ---------------------------------------------------------------------------
if [[ ",$skip," != *",fuzz,"* ]]; then
  start=$SECONDS
  common_env
  if bash "$repo/tests/fuzz/run.sh" "$asan" "${TAGMEM_FUZZ_SECONDS:-60}" "$asan/fuzz-work" \
      >"$asan.fuzz.out" 2>&1 && scan "$asan/fuzz-work/fuzz.log"; then
    summary+=("fuzzer: $(grep -E 'stat::number_of_executed_units' "$asan/fuzz-work/fuzz.log" | tail -1 | tr -s ' ') in $((SECONDS - start))s; $(grep -E '^\[tagmem fuzz\]' "$asan/fuzz-work/fuzz.log" | tail -1)")
  else
    cat "$asan.fuzz.out"
    summary+=("fuzzer: FAILED (see $asan.fuzz.out)")
    failed=1
  fi
fi

# ---- 2b. the rendezvous message fuzzer -------------------------------------------------------
if [[ ",$skip," != *",fuzz,"* ]]; then
  start=$SECONDS
  common_env
  work=$asan/rendezvous-fuzz-work
  mkdir -p "$work/corpus"
  cp -n "$repo"/tests/fuzz/rendezvous_corpus/* "$work/corpus/" 2>/dev/null || true
  log=$work/fuzz.log
  if ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0 \
     "$asan/tests/fuzz/tagmem_fuzz_rendezvous" -max_total_time="${TAGMEM_RDV_FUZZ_SECONDS:-30}" \
       -seed=1 -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$work/" "$work/corpus" >"$log" 2>&1 &&
     [ -z "$(ls "$work"/crash-* "$work"/leak-* "$work"/oom-* "$work"/timeout-* 2>/dev/null)" ] &&
     scan "$log"; then
    summary+=("rendezvous fuzzer: $(grep -E 'stat::number_of_executed_units' "$log" | tail -1 | tr -s ' ') in $((SECONDS - start))s")
  else
    grep -B5 -A40 -E "rendezvous fuzz|ERROR: |runtime error" "$log" | head -80
    summary+=("rendezvous fuzzer: FAILED (see $log; keep a finding in tests/fuzz/rendezvous_corpus)")
    failed=1
  fi
fi

# ---- 3. TSan ---------------------------------------------------------------------------------
if [[ ",$skip," != *",tsan,"* ]]; then
  start=$SECONDS
  tsan=$root/thread
  configure "$tsan" thread
  ninja -C "$tsan" -j "$jobs" tagmem_emu tagmem_core_tests tagmem_stress_tests \
    tagmem_preload tagmem_preload_tests tagmem_handoff_tests >"$tsan.build.log" 2>&1 ||
    { tail -50 "$tsan.build.log"; exit 1; }
  common_env
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  export TAGMEM_LIBCUDA=$tsan/allocator/driver/emu/libtagmem_emu.so
  log=$tsan/threads.log
  # The core suite's threaded tests: Threads.*, the release thread (Release.*, EmulatorRelease.*),
  # background pinning and reuse across threads' per-thread streams (StreamReuse.*), the recycler
  # shared with the release thread (a swap that maps what its out-side unmaps; kept memory taken
  # by reloads while the release thread gives it back) and the pin-ahead thread (at the host
  # budget; shut down while it pins). The other recycling and pin-ahead tests run these same
  # interplays with more bytes, which under ThreadSanitizer costs minutes and finds nothing new.
  tsan_filter='Threads*:Release*:EmulatorRelease*:EmulatorPipeline.HostStorePins*:StreamReuse*'
  tsan_filter+=':EmulatorRecycle.TightSwapMapsWhatItsOutSideUnmaps'
  tsan_filter+=':EmulatorRecycle.KeptMemoryServesReloadsUntilReleased'
  tsan_filter+=':PinAhead.StaysWithinTheHostBudget:PinAhead.BadPlansAreRefused:EmulatorPinAhead*'
  if "$tsan/tests/core/tagmem_core_tests" --gtest_filter="$tsan_filter" \
       >"$log" 2>&1 &&
     "$tsan/tests/stress/tagmem_stress_tests" --gtest_filter='Stress*:EmulatorStress*' >>"$log" 2>&1 &&
     # Replicas that offload alone: the waiter thread unmaps beside the caller's calls on the tag.
     # Memory mapped ahead: the registry's thread maps into a tag beside the caller's calls.
     "$tsan/tests/handoff/tagmem_handoff_tests" \
       --gtest_filter='Replica.OneAfterTheOther*:Replica.KilledBeforeItsShareOnAKeptCopy:*MapAhead*' \
       >>"$log" 2>&1 &&
     # The shim's suite (its threads of runtime and driver calls, NCCL pauses of several ranks
     # and jobs beside interposed calls, thread exits), under the shim as ctest starts it. Its
     # tags reserve 16 GiB of addresses at a time, not 256: ThreadSanitizer leaves a program
     # about 1.5 TiB of address space, which the suite's tags would use up.
     (cd "$tsan" && env TAGMEM_ARENA_BYTES=16GiB "${shim_fuzz_env[@]}" \
        ctest -R '^(preload_emu|preload_calls_fuzz_emu)$' --timeout 900 -V) >>"$log" 2>&1 &&
     scan "$log"; then
    summary+=("tsan: $(grep -cE '^([0-9]+: )?\[       OK \]' "$log") threaded tests passed in $((SECONDS - start))s")
  else
    tail -80 "$log"
    summary+=("tsan: FAILED (see $log)")
    failed=1
  fi
  unset TAGMEM_LIBCUDA
fi

echo "---- sanitizers summary ----"
printf '%s\n' "${summary[@]}"
exit $failed
