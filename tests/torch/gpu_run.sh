#!/usr/bin/env bash
# gpu_run.sh — the PyTorch integration's run on a GPU machine (PyTorch 2.11, CUDA 13).
#
#   bash tests/torch/gpu_run.sh <build-dir> <out-dir> [--two-gpu] [--size small|full] [--only a,b]
#
# <build-dir> is a CMake build of this repository with the targets tagmem, tagmem_torch_alloc and
# tagmem_torch_entry_tests (libmimalloc.so.2 must be on LD_LIBRARY_PATH where it is not installed).
# Steps, each logged to <out-dir>/<step>.log:
#   package-pip  pip-installs integrations/torch (with the build's libraries) into a temporary
#                directory; the later steps import that copy (or the source tree if this fails).
#                Where this Python has no pip: package-setup.py (setup.py build) instead
#   python-api   pytest test_api.py test_entry_points.py test_dropin*.py (torch-free suites) on
#                this driver
#   entry-cpp    tagmem_torch_entry_tests (the entry points from C++)
#   libtorch     builds integrations/torch/libtorch against this PyTorch; runs its test (main,
#                late install, a recorded stream tracked and, with the hook off, not)
#   pytest-gpu   pytest test_gpu_*.py (PyTorch: MemPool and global modes, graphs, training, compat,
#                record_stream in global mode through the libtorch step's library, the engines'
#                call shapes)
#   bench        integrations/torch/bench/phase_switch.py (8B-shaped weights, tagmem vs .to("cpu"))
#   bench-rl-two integrations/torch/bench/rl_two.py (the two-process switch, tagmem's handoff
#                variants beside torch_memory_saver)
#   fsdp2        with --two-gpu: torchrun --nproc-per-node 2 tests/torch/fsdp2_two_gpu.py
# With TAGMEM_LIBCUDA set (the emulated driver) only the torch-free steps can run: the PyTorch
# steps are reported NOT RUN, never as passed. --size small (the emulator's default) shrinks the
# large tensors and the benchmark. --only runs the listed steps (and always the package step), to
# split a run across calls with a time limit. Prints a summary last; exits 1 if any step failed.
set -uo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <build-dir> <out-dir> [--two-gpu] [--size small|full] [--only a,b]" >&2
  exit 2
fi
BUILD=$(realpath "$1")
mkdir -p "$2"
OUT=$(realpath "$2")
shift 2
TWO_GPU=0
SIZE=""
ONLY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --two-gpu) TWO_GPU=1 ;;
    --size) SIZE="$2"; shift ;;
    --only) ONLY=",$2,"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${TAGMEM_PYTHON:-python3}
EMULATOR=0
[[ -n "${TAGMEM_LIBCUDA:-}" ]] && EMULATOR=1
[[ -z "$SIZE" ]] && { [[ $EMULATOR == 1 ]] && SIZE=small || SIZE=full; }
export TAGMEM_TEST_SIZE=$SIZE NCCL_NVLS_ENABLE=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

SUMMARY=()
FAILED=0
# step <name> <command...>: runs the command with its output in $OUT/<name>.log.
step() {
  local name=$1; shift
  local start=$SECONDS
  echo "== $name: $*" | tee "$OUT/$name.log"
  "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  if [[ $rc == 0 ]]; then
    SUMMARY+=("PASS     $name (${took}s)")
  else
    SUMMARY+=("FAIL     $name (exit $rc, ${took}s): see $OUT/$name.log")
    FAILED=1
  fi
  return $rc
}
not_run() { SUMMARY+=("NOT RUN  $1: $2"); echo "NOT RUN $1: $2" >"$OUT/$1.log"; }
# wanted <name>: whether --only selects the step (all steps without --only); else reports NOT RUN.
wanted() {
  [[ -z "$ONLY" || "$ONLY" == *",$1,"* ]] && return 0
  not_run "$1" "not selected (--only)"
  return 1
}

{
  echo "date: $(date -u +%FT%TZ)"; echo "build: $BUILD"; echo "size: $SIZE emulator: $EMULATOR"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true
} >"$OUT/environment.log"

# ---- package: install into a temporary directory ----------------------------------------------
# pip install when this Python has pip (the GPU machine); otherwise (a build machine without pip)
# setup.py build, under its own step name so the summary says which was tested.
SITE="$WORK/site"
cp -r "$REPO/integrations/torch" "$WORK/package-source"  # builds write into their source tree
install_package() {
  if [[ $1 == pip ]]; then
    TAGMEM_BUILD_DIR="$BUILD" $PY -m pip install --no-deps --no-build-isolation --no-cache-dir \
      --target "$SITE" "$WORK/package-source" || return 1
  else
    (cd "$WORK/package-source" &&
      TAGMEM_BUILD_DIR="$BUILD" $PY setup.py -q build --build-base "$WORK/setup-build") &&
      mkdir -p "$SITE" && cp -r "$WORK/setup-build/lib/." "$SITE/" || return 1
  fi
  PYTHONPATH="$SITE" $PY -c "
import tagmem, tagmem._entry_points as ep
print('library', tagmem.library_file(), 'entry points', ep.path())
assert tagmem.library_file().startswith('$SITE'), 'the installed package did not use its own library'
assert ep.path().startswith('$SITE')"
}
if $PY -m pip --version >/dev/null 2>&1; then METHOD=pip; else METHOD=setup.py; fi
if (unset TAGMEM_LIBRARY TAGMEM_TORCH_LIBRARY; step package-$METHOD install_package $METHOD); then
  SUMMARY+=("PASS     package-$METHOD")
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  unset TAGMEM_LIBRARY TAGMEM_TORCH_LIBRARY
else  # keep going from the source tree so the other steps still say something
  SUMMARY+=("FAIL     package-$METHOD: see $OUT/package-$METHOD.log")
  FAILED=1
  export PYTHONPATH="$REPO/integrations/torch${PYTHONPATH:+:$PYTHONPATH}"
  export TAGMEM_LIBRARY="$BUILD/allocator/libtagmem.so.1"
  export TAGMEM_PRELOAD_LIBRARY="$BUILD/integrations/preload/libtagmem_preload.so"
  export TAGMEM_TORCH_LIBRARY="$BUILD/integrations/torch/libtagmem_torch_alloc.so"
fi

PYTEST=($PY -m pytest -p no:cacheprovider -v -rA)
cd "$REPO"

# ---- torch-free suites ------------------------------------------------------------------------
wanted python-api && step python-api "${PYTEST[@]}" tests/torch/test_api.py tests/torch/test_entry_points.py \
  tests/torch/test_dropin.py tests/torch/test_dropin_environment.py tests/torch/test_preload_path.py \
  tests/torch/test_one_tagmem.py tests/torch/test_tms_state.py tests/torch/test_vllm_state.py \
  tests/torch/test_api_edges.py tests/torch/test_tms_callers.py tests/torch/test_tms_abi.py
if ! wanted entry-cpp; then
  :
elif [[ -x "$BUILD/tests/torch/tagmem_torch_entry_tests" ]]; then
  # The build's RUNPATHs are absolute paths of the machine that built it.
  step entry-cpp env LD_LIBRARY_PATH="$BUILD/allocator:$BUILD/integrations/torch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$BUILD/tests/torch/tagmem_torch_entry_tests"
else
  step entry-cpp false "$BUILD/tests/torch/tagmem_torch_entry_tests was not built"
fi

# ---- PyTorch suites ---------------------------------------------------------------------------
if [[ $EMULATOR == 1 ]]; then
  for s in pytest-gpu libtorch bench bench-rl-two fsdp2; do
    not_run $s "TAGMEM_LIBCUDA is set (emulated driver); PyTorch needs a real GPU"
  done
elif ! step torch-available $PY -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__)'; then
  for s in pytest-gpu libtorch bench bench-rl-two fsdp2; do not_run $s "PyTorch with CUDA is unavailable"; done
else

  build_libtorch() {
    local prefix
    prefix=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
    local generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S "$REPO/integrations/torch/libtorch" -B "$WORK/libtorch" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DTAGMEM_BUILD_DIR="$BUILD" -DCMAKE_PREFIX_PATH="$prefix" &&
      cmake --build "$WORK/libtorch" -j "$(nproc)" &&
      "$WORK/libtorch/tagmem_libtorch_test" &&
      "$WORK/libtorch/tagmem_libtorch_test" late &&
      "$WORK/libtorch/tagmem_libtorch_test" record &&
      "$WORK/libtorch/tagmem_libtorch_test" record untracked
  }
  # Before pytest-gpu: Python's global mode loads the library this builds (record streams,
  # memory_stats, empty_cache; test_gpu_record_stream.py needs it).
  wanted libtorch && step libtorch build_libtorch
  [[ -f "$WORK/libtorch/libtagmem_libtorch.so" ]] &&
    export TAGMEM_LIBTORCH_LIBRARY="$WORK/libtorch/libtagmem_libtorch.so"

  wanted pytest-gpu && step pytest-gpu "${PYTEST[@]}" tests/torch/test_gpu_mempool.py tests/torch/test_gpu_training.py \
    tests/torch/test_gpu_global.py tests/torch/test_gpu_compat.py tests/torch/test_gpu_dropin.py \
    tests/torch/test_gpu_record_stream.py tests/torch/test_gpu_engine_shapes.py

  if [[ $SIZE == small ]]; then
    BENCH_ARGS=(--layers 2 --scale 8 --cycles 3)
  else
    BENCH_ARGS=(--cycles 5)
  fi
  wanted bench && step bench $PY integrations/torch/bench/phase_switch.py "${BENCH_ARGS[@]}" --out "$OUT/bench.json"
  # Every method but tagmem_early_shared, whose side-by-side with tagmem_early is
  # `gpu_all.sh handoff`'s step torch_rl_two: the step stays within the torch part's time.
  RL_TWO_ARGS=(--methods tagmem,tagmem_handoff,tagmem_overlap,tagmem_early,tms_retain)
  if [[ $SIZE == small ]]; then
    RL_TWO_ARGS+=(--layers 2 --scale 8 --kv-gib 1 --cycles 3)
  else
    RL_TWO_ARGS+=(--cycles 3)
  fi
  wanted bench-rl-two && step bench-rl-two $PY integrations/torch/bench/rl_two.py "${RL_TWO_ARGS[@]}"

  if ! wanted fsdp2; then
    :
  elif [[ $TWO_GPU == 1 ]]; then
    step fsdp2 $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
      tests/torch/fsdp2_two_gpu.py 6
  else
    not_run fsdp2 "needs --two-gpu (two GPUs)"
  fi
fi

# ---- summary ----------------------------------------------------------------------------------
{
  echo
  echo "==== tagmem PyTorch integration: summary ($(basename "$OUT"), size $SIZE) ===="
  for log in python-api pytest-gpu; do
    line=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$OUT/$log.log" 2>/dev/null | tail -1)
    [[ -n "$line" ]] && echo "$log: $line"
  done
  [[ -f "$OUT/libtorch.log" ]] && grep -E '^(PASS|FAIL): ' "$OUT/libtorch.log" | sed 's/^/libtorch: /'
  [[ -f "$OUT/fsdp2.log" ]] && grep -E '^(PASS|FAIL) fsdp2' "$OUT/fsdp2.log"
  [[ -f "$OUT/bench.log" ]] && grep -E '^\|' "$OUT/bench.log"
  [[ -f "$OUT/bench-rl-two.log" ]] && grep -E '^\||ERROR' "$OUT/bench-rl-two.log"
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUT/summary.txt"
exit $FAILED
