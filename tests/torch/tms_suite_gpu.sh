#!/usr/bin/env bash
# tms_suite_gpu.sh — torch_memory_saver's own test suite, natively and through tagmem's drop-in, on
# a GPU machine; then the engines' call shapes (tests/torch/test_gpu_engine_shapes.py).
#
#   bash tests/torch/tms_suite_gpu.sh <torch_memory_saver source dir> <tagmem build dir> [<out dir>]
#
# <torch_memory_saver source dir>: a checkout of torch_memory_saver (its latest release). It is
#   built from source with `TMS_CUDA_MAJOR=13 pip install --no-deps --no-build-isolation --target`
#   into a temporary directory (TMS_CUDA_MAJOR can be overridden from the environment).
# <tagmem build dir>: a CMake build of this repository with the targets tagmem, tagmem_torch_alloc
#   and tagmem_preload; the drop-in is used from this checkout's integrations/torch.
# <out dir>: where the logs go (default: a temporary directory, kept and named at the end).
#
# Runs, in torch_memory_saver's test/ directory, `pytest test_examples.py
# test_configure_subprocess.py` twice: with the package just built (native), then with
# TAGMEM_AS_TORCH_MEMORY_SAVER=1 and a copy of tagmem's tms_path first on PYTHONPATH, with the
# suite's test-only torch_memory_saver/testing_utils.py copied into it. The suite runs each example
# in both hook modes itself ("preload" under configure_subprocess(), "torch"). Prints both tallies
# (passed, failed, skipped) and each test's outcome side by side, then the call-shape tests.
# Exits 1 when the drop-in's tally differs from the native one or a call-shape test fails.
# TMS_SUITE_K=<pytest -k expression> narrows both runs to the matching tests and skips the call
# shapes (a focused rerun, e.g. TMS_SUITE_K="test_cpu_backup and torch"); the rest of the
# environment reaches both runs (TAGMEM_* settings affect the drop-in's only).
set -uo pipefail
export LC_ALL=C  # sort and join agree on the order

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <torch_memory_saver source dir> <tagmem build dir> [<out dir>]" >&2
  exit 2
fi
TMS_SRC=$(realpath "$1")
BUILD=$(realpath "$2")
OUT=${3:-$(mktemp -d -t tms_suite.XXXXXX)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${TAGMEM_PYTHON:-python3}
WORK=$(mktemp -d -t tms_suite_work.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

for f in test/test_examples.py test/test_configure_subprocess.py torch_memory_saver/testing_utils.py; do
  [[ -f "$TMS_SRC/$f" ]] || { echo "$TMS_SRC/$f is missing: not a torch_memory_saver checkout" >&2; exit 2; }
done
LIBTAGMEM="$BUILD/allocator/libtagmem.so.1"
LIBTORCH_ALLOC="$BUILD/integrations/torch/libtagmem_torch_alloc.so"
LIBPRELOAD="$BUILD/integrations/preload/libtagmem_preload.so"
for f in "$LIBTAGMEM" "$LIBTORCH_ALLOC" "$LIBPRELOAD"; do
  [[ -f "$f" ]] || { echo "$f is missing: build tagmem, tagmem_torch_alloc and tagmem_preload" >&2; exit 2; }
done
export NCCL_NVLS_ENABLE=0

# ---- torch_memory_saver, built from source ------------------------------------------------------
NATIVE="$WORK/native"
echo "== building torch_memory_saver from $TMS_SRC (log: $OUT/build.log)"
if ! TMS_CUDA_MAJOR=${TMS_CUDA_MAJOR:-13} $PY -m pip install --no-deps --no-build-isolation \
    --target "$NATIVE" "$TMS_SRC" >"$OUT/build.log" 2>&1; then
  echo "FAIL: the build of torch_memory_saver failed; see $OUT/build.log" >&2
  tail -20 "$OUT/build.log" >&2
  exit 1
fi

# ---- tagmem's drop-in under the same name -------------------------------------------------------
SHIM="$WORK/tms_path"
cp -r "$REPO/integrations/torch/tagmem/compat/tms_path" "$SHIM"
cp "$TMS_SRC/torch_memory_saver/testing_utils.py" "$SHIM/torch_memory_saver/"
TAGMEM_ENV=(
  TAGMEM_LIBRARY="$LIBTAGMEM"
  TAGMEM_TORCH_LIBRARY="$LIBTORCH_ALLOC"
  TAGMEM_PRELOAD_LIBRARY="$LIBPRELOAD"
  TAGMEM_AS_TORCH_MEMORY_SAVER=1
  PYTHONPATH="$SHIM:$REPO/integrations/torch${PYTHONPATH:+:$PYTHONPATH}"
)

SUITE=(test_examples.py test_configure_subprocess.py)
[[ -n ${TMS_SUITE_K:-} ]] && SUITE+=(-k "$TMS_SUITE_K")
run_suite() {  # run_suite <name> <env assignments...>
  local name=$1; shift
  echo "== $name: pytest ${SUITE[*]} (log: $OUT/$name.log)"
  (cd "$TMS_SRC/test" && env "$@" $PY -m pytest -p no:cacheprovider -v -rA "${SUITE[@]}") \
    >"$OUT/$name.log" 2>&1
}
run_suite native -u TAGMEM_AS_TORCH_MEMORY_SAVER -u LD_PRELOAD PYTHONPATH="$NATIVE${PYTHONPATH:+:$PYTHONPATH}"
run_suite tagmem "${TAGMEM_ENV[@]}"

# The count of `word` (passed, failed, skipped, error) in a pytest log's final line.
count() {
  local n
  n=$(grep -E '^=+ .* in [0-9.]+s' "$1" | tail -1 | grep -oE "[0-9]+ $2" | grep -oE '^[0-9]+')
  echo "${n:-0}"
}
# Each test's outcome (-rA lines: "PASSED test_x.py::name[...]").
outcomes() {
  grep -E '^(PASSED|FAILED|SKIPPED|ERROR) ' "$1" | sed -E 's/^SKIPPED \[[0-9]+\] /SKIPPED /' |
    awk '{o=$1; $1=""; sub(/^ /, ""); sub(/ - .*/, ""); print $0 "\t" o}' | sort
}
outcomes "$OUT/native.log" >"$WORK/native.txt"
outcomes "$OUT/tagmem.log" >"$WORK/tagmem.txt"

echo
echo "==== torch_memory_saver's suite ($(basename "$TMS_SRC"), $(cd "$TMS_SRC" && git describe --tags --always 2>/dev/null || echo 'no git'))"
printf '| run | passed | failed | skipped | errors |\n|---|---|---|---|---|\n'
for run in native tagmem; do
  printf '| %s | %s | %s | %s | %s |\n' "$run" "$(count "$OUT/$run.log" passed)" \
    "$(count "$OUT/$run.log" failed)" "$(count "$OUT/$run.log" skipped)" "$(count "$OUT/$run.log" error)"
done
echo
echo "per test (native / tagmem):"
join -t $'\t' -a1 -a2 -e '-' -o 0,1.2,2.2 "$WORK/native.txt" "$WORK/tagmem.txt" |
  awk -F'\t' '{printf "  %-70s %-8s %-8s%s\n", $1, $2, $3, ($2 != $3 ? "  <- differs" : "")}'
STATUS=0
for word in passed failed skipped; do
  [[ $(count "$OUT/native.log" $word) == $(count "$OUT/tagmem.log" $word) ]] || STATUS=1
done

# ---- the engines' call shapes -------------------------------------------------------------------
if [[ -n ${TMS_SUITE_K:-} ]]; then
  echo
  echo "logs: $OUT (call shapes skipped: TMS_SUITE_K is set)"
  exit $STATUS
fi
echo
echo "== call shapes: pytest tests/torch/test_gpu_engine_shapes.py (log: $OUT/shapes.log)"
(cd "$REPO" && env TAGMEM_LIBRARY="$LIBTAGMEM" TAGMEM_TORCH_LIBRARY="$LIBTORCH_ALLOC" \
  TAGMEM_PRELOAD_LIBRARY="$LIBPRELOAD" PYTHONPATH="$REPO/integrations/torch${PYTHONPATH:+:$PYTHONPATH}" \
  $PY -m pytest -p no:cacheprovider -v -rA tests/torch/test_gpu_engine_shapes.py) >"$OUT/shapes.log" 2>&1 ||
  STATUS=1
grep -E '^(PASSED|FAILED|ERROR) ' "$OUT/shapes.log" | sed 's/^/  /'
grep -E '^=+ .* in [0-9.]+s' "$OUT/shapes.log" | tail -1
echo
echo "logs: $OUT"
[[ $STATUS == 0 ]] && echo "RESULT: the drop-in's tally equals the native one; call shapes pass" ||
  echo "RESULT: differences above"
exit $STATUS
