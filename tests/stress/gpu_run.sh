#!/usr/bin/env bash
# The GPU part of the reliability work (docs/reliability.md), on the real driver:
#   1. out of memory for real: the device filled from outside tagmem, a reload that cannot fit
#      fails cleanly, then succeeds with every byte right (OutOfMemory.*);
#   2. multi-threaded stress on several streams with offloads alongside (Stress.*);
#   3. the soak: 1,000 trainer <-> engine phase switches, every one verified, memory in use back
#      within 2 MiB (Soak.*);
#   4. compute-sanitizer memcheck over the core GPU suite (tagmem_core_tests, Emulator* excluded):
#      once over everything with API-error reports off (the Errors suite provokes out-of-memory
#      on purpose), once over the rest with API-error reports on. Zero errors required;
#   5. processes that exit without tagmem_shutdown while the release or pinning thread is inside
#      the driver (tests/stress/exit_probe.sh): every one must leave cleanly.
# Full logs go to <out-dir>; a summary is printed last; the exit status is non-zero on any
# failure.
#
# Usage: bash tests/stress/gpu_run.sh <build-dir> <out-dir>
# With TAGMEM_LIBCUDA naming libtagmem_emu.so it runs unchanged on the emulator at small sizes
# (compute-sanitizer, which needs the real driver, is then reported as not run). Knobs (defaults
# for a GPU / for the emulator): TAGMEM_SOAK_SWITCHES (1000 / 40), TAGMEM_SOAK_WEIGHTS_MIB
# (512 / 8), TAGMEM_SOAK_KV_MIB (8192 / 16), TAGMEM_OOM_MIB (4096 / 64), TAGMEM_STRESS_ROUNDS
# (40 / 12), TAGMEM_STRESS_THREADS (6 / 4), TAGMEM_STRESS_MAX_KIB (4096 / 512),
# TAGMEM_EXIT_RUNS (10 / 3) and TAGMEM_EXIT_MIB (16384 / 64) for the exit probe.
set -uo pipefail
build=$(cd "${1:?usage: gpu_run.sh <build-dir> <out-dir>}" && pwd)
mkdir -p "${2:?usage: gpu_run.sh <build-dir> <out-dir>}"
out=$(cd "$2" && pwd)
export NCCL_NVLS_ENABLE=0
core=$build/tests/core/tagmem_core_tests
stress=$build/tests/stress/tagmem_stress_tests
probe=$build/tests/stress/tagmem_exit_probe
for bin in "$core" "$stress" "$probe"; do
  [ -x "$bin" ] || {
    echo "missing $bin (build tagmem_core_tests, tagmem_stress_tests and tagmem_exit_probe)"
    exit 2
  }
done

if [[ "${TAGMEM_LIBCUDA:-}" == *tagmem_emu* ]]; then
  where="emulator ($TAGMEM_LIBCUDA)"
  small=1
else
  unset TAGMEM_LIBCUDA
  where="real driver (libcuda.so.1)"
  small=0
fi
pick() { if [ "$small" = 1 ]; then echo "$2"; else echo "$1"; fi; }
export TAGMEM_SOAK_SWITCHES=${TAGMEM_SOAK_SWITCHES:-$(pick 1000 40)}
export TAGMEM_SOAK_WEIGHTS_MIB=${TAGMEM_SOAK_WEIGHTS_MIB:-$(pick 512 8)}
export TAGMEM_SOAK_KV_MIB=${TAGMEM_SOAK_KV_MIB:-$(pick 8192 16)}
export TAGMEM_OOM_MIB=${TAGMEM_OOM_MIB:-$(pick 4096 64)}
export TAGMEM_STRESS_ROUNDS=${TAGMEM_STRESS_ROUNDS:-$(pick 40 12)}
export TAGMEM_STRESS_THREADS=${TAGMEM_STRESS_THREADS:-$(pick 6 4)}
export TAGMEM_STRESS_MAX_KIB=${TAGMEM_STRESS_MAX_KIB:-$(pick 4096 512)}
export TAGMEM_EXIT_RUNS=${TAGMEM_EXIT_RUNS:-$(pick 10 3)}
export TAGMEM_EXIT_MIB=${TAGMEM_EXIT_MIB:-$(pick 16384 64)}

summary=()
failed=0
step() {  # <name> <timeout-s> <log> <command...>
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" >"$log" 2>&1 || rc=$?
  local took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    summary+=("PASS  $name (${took}s)")
  else
    [ $rc -eq 124 ] && echo "[$name] timed out after ${limit}s" >>"$log"
    summary+=("FAIL  $name (exit $rc after ${took}s; log: $log)")
    failed=1
  fi
  grep -hE "^\[(oom|stress|soak)\]|^exit_probe" "$log" | sed "s/^/      /" >>"$out/figures.txt" ||
    true
}

: >"$out/figures.txt"
{
  echo "where: $where"
  echo "date: $(date -u +%FT%TZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null
  env | grep -E "^TAGMEM_" | sort
} >"$out/environment.txt"

step "out of memory (OutOfMemory.*)" 120 "$out/oom.log" "$stress" --gtest_filter='OutOfMemory.*'
step "multi-threaded stress (Stress.*)" 180 "$out/stress.log" "$stress" --gtest_filter='Stress.*'
step "soak, $TAGMEM_SOAK_SWITCHES switches (Soak.*)" 300 "$out/soak.log" "$stress" \
  --gtest_filter='Soak.*'
step "exit without shutdown, $TAGMEM_EXIT_RUNS runs a mode" 300 "$out/exit.log" \
  bash "$(dirname "$0")/exit_probe.sh" "$probe" "$TAGMEM_EXIT_RUNS" "$TAGMEM_EXIT_MIB"

if [ "$small" = 1 ]; then
  summary+=("----  compute-sanitizer: not run on the emulator (it needs the real driver)")
else
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
    2>/dev/null | head -1)
  if [ -z "$sanitizer" ]; then
    summary+=("FAIL  compute-sanitizer not found (looked in PATH and /usr/local/cuda*)")
    failed=1
  else
    # Fork* forks the tested process: under compute-sanitizer its children hang until the test
    # kills them, while the same tests pass in the plain core run; they are checked there.
    step "memcheck, core GPU suite, API errors not reported" 240 "$out/memcheck_all.log" \
      "$sanitizer" --tool memcheck --leak-check full --error-exitcode 1 --report-api-errors no \
      "$core" --gtest_filter='-Emulator*:Fork*'
    # Errors.*, Release.AllocationRightAfterADiscard* and the two Observe.*OutOfMemory* tests fail
    # driver calls on purpose (out-of-memory cuMemCreate calls: the Release test's answered by
    # waiting for tagmem's background releases, the Observe tests' reported with their message);
    # KeepBackup.* asks cuMemHostGetFlags whether memory is still pinned (INVALID_VALUE says it is
    # not) and SharedCopyRefusal.* hands tagmem descriptors the driver must refuse.
    # Under this mode that test once saw its retry fail too, which plain runs and the pass above
    # never showed (docs/reliability.md).
    step "memcheck, core GPU suite without Errors.*, API errors reported" 240 \
      "$out/memcheck_api.log" "$sanitizer" --tool memcheck --leak-check full --error-exitcode 1 \
      --report-api-errors explicit "$core" \
      --gtest_filter='-Emulator*:Fork*:Errors*:Release.AllocationRightAfterADiscard*:Observe.*OutOfMemory*:KeepBackup.*:SharedCopyRefusal.*'
    for log in "$out/memcheck_all.log" "$out/memcheck_api.log"; do
      grep -hE "ERROR SUMMARY|PASSED|FAILED" "$log" | sed "s/^/      /" >>"$out/figures.txt" || true
    done
  fi
fi

echo "==== tagmem reliability on the $where ===="
cat "$out/figures.txt"
printf '%s\n' "${summary[@]}"
[ $failed -eq 0 ] && echo "ALL PASSED" || echo "SOME FAILED (logs in $out)"
exit $failed
