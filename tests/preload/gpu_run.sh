#!/usr/bin/env bash
# gpu_run.sh <build-dir> <out-dir> [--one-gpu] — the GPU checks of the LD_PRELOAD shim and NCCL
# memory.
#
# On a machine with 2 GPUs, PyTorch and NCCL (TAGMEM_LIBCUDA unset):
#   emu-preload-tests        the CI suite of tests/preload on the emulated driver (if built)
#   baseline-cumem{1,0}      torch.distributed NCCL job without the shim: result digests
#   pause-cumem{1,0}         the same job under the shim: NCCL memory held, share a collective
#                            pause gives back (must be >= 90% with NCCL_CUMEM_ENABLE=1; only
#                            reported with =0, where NCCL uses cuMemAlloc), TAGMEM_GPU_CYCLES
#                            pause/resume cycles with bit-identical results and free memory
#                            within 2 MiB of cycle 1
#   pause-cumem0-vmm         NCCL_CUMEM_ENABLE=0, NCCL_P2P_DISABLE=1 and the shim serving NCCL's
#                            cuMemAlloc with virtual memory (TAGMEM_NCCL_CUMEMALLOC=vmm): reported
#   runtime-default-tag      an unmodified PyTorch workload under the shim with a default tag,
#                            offloaded/reloaded through the C API (values and addresses kept)
#   free-ordering            PyTorch under the shim with a default tag: a tensor freed on a side
#                            stream while its kernels run, empty_cache(), a new tensor on the
#                            default stream; not one byte of it may be overwritten (5 trials)
#   register-1rank           a tagged MemPool registered with a one-rank NCCL communicator
#                            (ncclCommRegister through the shim): offload allowed, bytes kept,
#                            collectives exact before and after (torch_nccl_register.py)
#   register-2rank           the same with two ranks and a captured CUDA graph: offload refused
#                            with PEER while NCCL shares the buffer, allowed after
#                            deregister_mem_pool, exact results and no hang after re-registering
#   ctx-free                 cudaFree while a cuCtxCreate context's stream still writes the
#                            memory: the shim's cudaFree waits (or not) exactly as CUDA's does
# --one-gpu runs only what needs a single GPU (the emulator suite, runtime-default-tag,
# free-ordering, register-1rank and ctx-free) and reports the two-rank NCCL phases as SKIP.
# With TAGMEM_LIBCUDA set (emulated driver) only the emulator suite runs; the PyTorch phases
# are reported as SKIP (they need a real GPU), never as passed.
#
# Knobs: TAGMEM_GPU_ELEMS (elements per collective, default 4194304), TAGMEM_GPU_CYCLES
# (default 50), TAGMEM_GPU_PHASE_TIMEOUT (seconds per phase, default 240), TAGMEM_GPU_ONLY
# (space-separated phase names to run, e.g. "baseline-cumem1 pause-cumem1"; default all),
# PYTHON (python3). The whole run takes a few minutes on 2 H200s.
# Needs from the build: integrations/preload/libtagmem_preload.so (and, for the emulator phase,
# allocator/driver/emu/libtagmem_emu.so and tests/preload/tagmem_preload_tests). If
# libmimalloc.so.2 is on LD_LIBRARY_PATH tagmem keeps its records there (Note [private mimalloc]).
# Full logs and per-rank JSON metrics go to <out-dir>; a summary is printed last; the exit
# status is non-zero if any phase failed.
set -uo pipefail

ONE_GPU=0
if [ $# -eq 3 ] && [ "$3" = --one-gpu ]; then
  ONE_GPU=1
elif [ $# -ne 2 ]; then
  echo "usage: $0 <build-dir> <out-dir> [--one-gpu]" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && OUT=$(cd "$2" && pwd) || exit 2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
SHIM=$BUILD/integrations/preload/libtagmem_preload.so
EMU=$BUILD/allocator/driver/emu/libtagmem_emu.so
TESTS=$BUILD/tests/preload/tagmem_preload_tests
ELEMS=${TAGMEM_GPU_ELEMS:-4194304}
CYCLES=${TAGMEM_GPU_CYCLES:-50}
PHASE_TIMEOUT=${TAGMEM_GPU_PHASE_TIMEOUT:-240}
ONLY=${TAGMEM_GPU_ONLY:-}
export NCCL_NVLS_ENABLE=0   # never NVLS (multicast) here
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

SUMMARY=()
FAILED=0
run_phase() {  # name, command...
  local name=$1
  shift
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
    SUMMARY+=("SKIP  $name (not in TAGMEM_GPU_ONLY)")
    return
  fi
  local start=$SECONDS
  echo "== $name: $*" >"$OUT/$name.log"
  timeout --kill-after=30 "$PHASE_TIMEOUT" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    SUMMARY+=("PASS  $name (${took}s)")
  else
    [ $rc -eq 124 ] && rc="timeout after ${PHASE_TIMEOUT}s"
    SUMMARY+=("FAIL  $name (exit $rc, ${took}s; see $OUT/$name.log)")
    FAILED=1
  fi
}
skip_phase() { SUMMARY+=("SKIP  $1 ($2)"); }

if [ ! -f "$SHIM" ]; then
  echo "FAIL: $SHIM is missing (build the tagmem_preload target)"
  exit 1
fi

# ---- the emulator suite ------------------------------------------------------------------------
if [ -x "$TESTS" ] && [ -f "$EMU" ]; then
  RDV=$(mktemp -d /tmp/tagmem-preload-XXXXXX)
  EMU_ENV=(LD_PRELOAD="$SHIM" TAGMEM_LIBCUDA="$EMU" TAGMEM_PRELOAD_DRIVER_CALLERS=tagmem_preload_tests
           LD_LIBRARY_PATH="$BUILD/tests/preload:${EMU%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
           TAGMEM_NCCL_DIR="$RDV/rdv" TAGMEM_NCCL_CUMEMALLOC=vmm)
  run_phase emu-preload-tests env "${EMU_ENV[@]}" "$TESTS" \
    --gtest_filter=-RuntimeDefaultTag.*:DlsymNext.*:TmsInitEnable.*:NcclTagSlab.*
  run_phase emu-preload-host-slab env "${EMU_ENV[@]}" TAGMEM_HOST_SLAB_BYTES=32MiB "$TESTS" \
    --gtest_filter=NcclTagSlab.*
  run_phase emu-preload-rtld-next env "${EMU_ENV[@]}" "$TESTS" --gtest_filter=DlsymNext.*
  run_phase emu-preload-default-tag env "${EMU_ENV[@]}" TAGMEM_PRELOAD_TAG=everything "$TESTS" \
    --gtest_filter=RuntimeDefaultTag.*
  run_phase emu-preload-tms-init env "${EMU_ENV[@]}" TMS_INIT_ENABLE=1 "$TESTS" \
    --gtest_filter=TmsInitEnable.*
  rm -rf "$RDV"
else
  skip_phase emu-preload-tests "not built: $TESTS / $EMU"
fi

# ---- PyTorch + NCCL on real GPUs ---------------------------------------------------------------
NCCL_PHASES=(baseline-cumem1 pause-cumem1 baseline-cumem0 pause-cumem0 pause-cumem0-vmm
             register-2rank)
ONE_GPU_PHASES=(runtime-default-tag free-ordering register-1rank ctx-free)
GPUS_NEEDED=2
[ $ONE_GPU -eq 1 ] && GPUS_NEEDED=1
one_gpu_phases() {
  run_phase runtime-default-tag env LD_PRELOAD="$SHIM" TAGMEM_PRELOAD_TAG=torch \
    CUDA_VISIBLE_DEVICES=0 "$PY" "$HERE/torch_runtime_offload.py" --elems $((ELEMS * 4)) --cycles 5
  run_phase free-ordering env LD_PRELOAD="$SHIM" TAGMEM_PRELOAD_TAG=torch \
    CUDA_VISIBLE_DEVICES=0 "$PY" "$HERE/torch_free_ordering.py" --trials 5
  run_phase register-1rank env LD_PRELOAD="$SHIM" TAGMEM_PRELOAD_TAG=torch CUDA_VISIBLE_DEVICES=0 \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 "$HERE/torch_nccl_register.py"
  run_phase ctx-free env CUDA_VISIBLE_DEVICES=0 "$PY" "$HERE/ctx_free_probe.py" --compare "$SHIM"
}
if [ -n "${TAGMEM_LIBCUDA:-}" ]; then
  for p in "${NCCL_PHASES[@]}" "${ONE_GPU_PHASES[@]}"; do
    skip_phase "$p" "TAGMEM_LIBCUDA is set: PyTorch and NCCL need a real GPU"
  done
elif ! "$PY" -c "import torch, sys; sys.exit(torch.cuda.device_count() < $GPUS_NEEDED)" \
    >"$OUT/torch-check.log" 2>&1; then
  SUMMARY+=("FAIL  torch-check (PyTorch with $GPUS_NEEDED GPU(s) needed; see $OUT/torch-check.log)")
  FAILED=1
elif [ $ONE_GPU -eq 1 ]; then
  for p in "${NCCL_PHASES[@]}"; do skip_phase "$p" "--one-gpu: the NCCL job needs 2 GPUs"; done
  one_gpu_phases
else
  RUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2)
  for cumem in 1 0; do
    mkdir -p "$OUT/baseline-cumem$cumem" "$OUT/pause-cumem$cumem"
    run_phase "baseline-cumem$cumem" env NCCL_CUMEM_ENABLE=$cumem "${RUN[@]}" \
      "$HERE/torch_nccl_pause.py" --mode baseline --elems "$ELEMS" --cycles "$CYCLES" \
      --out "$OUT/baseline-cumem$cumem"
    share=0.9
    [ $cumem -eq 0 ] && share=0   # report only: NCCL then allocates with cuMemAlloc
    run_phase "pause-cumem$cumem" env NCCL_CUMEM_ENABLE=$cumem LD_PRELOAD="$SHIM" \
      TAGMEM_NCCL_GROUP="tagmem-gpu-$$-cumem$cumem" TAGMEM_PRELOAD_LOG=1 "${RUN[@]}" \
      "$HERE/torch_nccl_pause.py" --mode pause --elems "$ELEMS" --cycles "$CYCLES" \
      --out "$OUT/pause-cumem$cumem" --baseline "$OUT/baseline-cumem$cumem" --require-share "$share"
  done
  # NCCL_CUMEM_ENABLE=0 with the shim serving NCCL's cuMemAlloc from virtual memory: only
  # valid without CUDA IPC of those buffers, hence NCCL_P2P_DISABLE=1 (peers use host memory).
  mkdir -p "$OUT/pause-cumem0-vmm"
  run_phase pause-cumem0-vmm env NCCL_CUMEM_ENABLE=0 NCCL_P2P_DISABLE=1 TAGMEM_NCCL_CUMEMALLOC=vmm \
    LD_PRELOAD="$SHIM" TAGMEM_NCCL_GROUP="tagmem-gpu-$$-vmm" "${RUN[@]}" \
    "$HERE/torch_nccl_pause.py" --mode pause --elems "$ELEMS" --cycles "$CYCLES" \
    --out "$OUT/pause-cumem0-vmm" --baseline "$OUT/baseline-cumem0" --require-share 0
  run_phase register-2rank env LD_PRELOAD="$SHIM" TAGMEM_PRELOAD_TAG=torch \
    TAGMEM_NCCL_GROUP="tagmem-gpu-$$-register" "${RUN[@]}" "$HERE/torch_nccl_register.py" --graph
  one_gpu_phases
fi

# ---- summary -----------------------------------------------------------------------------------
echo
echo "==== tagmem preload GPU run: $(date -u +%FT%TZ), $(hostname), logs in $OUT"
for p in pause-cumem1 pause-cumem0 pause-cumem0-vmm; do
  [ -f "$OUT/$p.log" ] && grep -h -E '^\[rank [0-9]+\] (NCCL holds|pause gave back|FAIL)' "$OUT/$p.log" \
    | sed "s/^/  $p: /"
done
[ -f "$OUT/runtime-default-tag.log" ] && grep -h -E '^(tag |cycle 1:|runtime offload|FAIL)' \
  "$OUT/runtime-default-tag.log" | sed 's/^/  runtime-default-tag: /'
[ -f "$OUT/free-ordering.log" ] && grep -h -E '^(free ordering|FAIL)' "$OUT/free-ordering.log" \
  | sed 's/^/  free-ordering: /'
for p in register-1rank register-2rank; do
  [ -f "$OUT/$p.log" ] && grep -h -E '^\[rank [0-9]+\] (ok|FAIL|offload)' "$OUT/$p.log" \
    | sed "s/^/  $p: /"
done
for line in "${SUMMARY[@]}"; do echo "$line"; done
ran=$(printf '%s\n' "${SUMMARY[@]}" | grep -c -E '^(PASS|FAIL)')
skipped=$(printf '%s\n' "${SUMMARY[@]}" | grep -c '^SKIP')
[ $FAILED -eq 0 ] && echo "RESULT: PASS ($ran phases ran, $skipped skipped)" \
  || echo "RESULT: FAIL ($ran phases ran, $skipped skipped)"
exit $FAILED
