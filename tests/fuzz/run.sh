#!/usr/bin/env bash
# Runs the state-machine fuzzer for a bounded time (docs/reliability.md).
# Usage: bash tests/fuzz/run.sh <build-dir> [seconds] [work-dir]
#   <build-dir> was configured with CC=clang CXX=clang++ -DTAGMEM_BUILD_FUZZERS=ON (and usually
#   -DTAGMEM_SANITIZE=address,undefined); seconds defaults to TAGMEM_FUZZ_SECONDS or 120.
# The committed seed corpus (tests/fuzz/corpus) is copied into <work-dir>/corpus, which the run
# grows; the repository is never modified. A finding is saved as <work-dir>/crash-*: the script
# prints it and exits 1. To keep it fixed, copy it into tests/fuzz/regressions/ with a name that
# says what it found; tests/fuzz/replay_test.cpp replays it in every build from then on.
# TAGMEM_FUZZ_SEED (default 1) makes a run repeat itself, so that a CI gate passes or fails the
# same way on the same code; TAGMEM_FUZZ_SEED=random explores anew each time (use it, and longer
# runs, to look for bugs: docs/reliability.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh <build-dir> [seconds] [work-dir]}
seconds=${2:-${TAGMEM_FUZZ_SECONDS:-120}}
work=${3:-$build/fuzz-work}
fuzzer=$build/tests/fuzz/tagmem_fuzz_state_machine
emu=$build/allocator/driver/emu/libtagmem_emu.so
[ -x "$fuzzer" ] || { echo "no fuzzer at $fuzzer (configure with -DTAGMEM_BUILD_FUZZERS=ON)"; exit 2; }

mkdir -p "$work/corpus"
cp -n "$here"/corpus/* "$work/corpus/" 2>/dev/null || true
export TAGMEM_LIBCUDA=$emu
export TAGMEM_METADATA=${TAGMEM_METADATA:-system}  # tagmem's records visible to ASan
# intercept_tls_get_addr=0: see tests/sanitizers.sh (a clang 14 LeakSanitizer crash at exit).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:intercept_tls_get_addr=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# A tree linked with a shared sanitizer runtime (-shared-libsan) needs it preloaded: libFuzzer puts
# libstdc++ ahead of it. tests/sanitizers.sh links it statically, where this finds nothing.
runtime=$(ldd "$fuzzer" | awk '/libclang_rt\.(asan|ubsan)/ {print $3; exit}')
if [ -n "$runtime" ]; then export LD_PRELOAD=$runtime; fi
log=$work/fuzz.log
seed=${TAGMEM_FUZZ_SEED:-1}
seed_arg=()
[ "$seed" = random ] || seed_arg=(-seed="$seed")
echo "[fuzz] $fuzzer for ${seconds}s, seed $seed, corpus $work/corpus (log: $log)"
set +e
"$fuzzer" -max_total_time="$seconds" -timeout=120 -rss_limit_mb=6144 -max_len=4096 \
  "${seed_arg[@]}" -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" >"$log" 2>&1
rc=$?
set -e
grep -E "^\[tagmem fuzz\]|stat::number_of_executed_units|stat::peak_rss_mb|Done [0-9]+ runs" "$log" || true
crashes=$(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null || true)
if [ "$rc" -ne 0 ] || [ -n "$crashes" ]; then
  echo "[fuzz] FAILED (exit $rc). Findings: ${crashes:-none saved}"
  grep -A40 -E "FAILED|ERROR: |runtime error" "$log" | head -80
  echo "[fuzz] reproduce: TAGMEM_LIBCUDA=$emu $fuzzer <finding>; keep it: copy it into $here/regressions/"
  exit 1
fi
echo "[fuzz] passed: no finding in ${seconds}s"
