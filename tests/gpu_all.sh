#!/usr/bin/env bash
# Runs one part of the GPU pass on the device machine over a build staged by tests/gpu_stage.sh
# (carried as .carry), writing logs under /tmp/gpu-out/PART and, when $OUT is set, a tarball of
# them into $OUT.
#
#   bash tests/gpu_all.sh core     core suite on the real driver (its Emulator* suites failing
#                                  each test, not crashing), the demo, reliability (1 GPU)
#   bash tests/gpu_all.sh bench    benchmarks/gpu_run.sh (1 GPU)
#   bash tests/gpu_all.sh torch    tests/torch/gpu_run.sh, single GPU
#   bash tests/gpu_all.sh shim     tests/preload/gpu_run.sh --one-gpu (1 GPU)
#   bash tests/gpu_all.sh ipc      tagged-memory IPC: the C suite and tests/torch/ipc_torch_gpu.py
#                                  in each mode (1 GPU)
#   bash tests/gpu_all.sh handoff  two processes on one GPU: the handoff suites
#                                  (tests/handoff/gpu_filter.txt) and the rl_two_process
#                                  benchmark in every variant and shape, and the overlapping
#                                  ones with a step between switches, and the overlapping
#                                  switch through PyTorch (docs/handoff.md) (1 GPU)
#   bash tests/gpu_all.sh multi    tests/preload/gpu_run.sh and FSDP2 (2 GPUs)
#
# GPU_ALL_STEPS=a,b runs only the named steps of the part (the names in summary.txt), so that a
# part longer than one device call can run in pieces.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_all.sh core|bench|torch|shim|ipc|handoff|multi}
build=$PWD/.carry/build
out=/tmp/gpu-out/$part
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.carry/lib:$build/allocator${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset TAGMEM_LIBCUDA
status=0
step() {  # step NAME TIMEOUT COMMAND...
  local name=$1 limit=$2
  shift 2
  [ -n "${GPU_ALL_STEPS:-}" ] && [[ ",$GPU_ALL_STEPS," != *",$name,"* ]] && return 0
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  printf '%-12s rc=%-3d %4ds\n' "$name" "$rc" $((SECONDS - t0)) | tee -a "$out/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >"$out/gpu.txt" 2>&1
case $part in
  core)
    step core 240 "$build/tests/core/tagmem_core_tests" --gtest_filter=-Emulator*
    step emulator_suites_fail 60 bash tests/core/emulator_suites_fail.sh \
      "$build/tests/core/tagmem_core_tests"
    step demo 240 "$build/benchmarks/demo/tagmem_demo" --cycles 3
    step stress 420 bash tests/stress/gpu_run.sh "$build" "$out/stress"
    ;;
  bench) step bench 560 bash benchmarks/gpu_run.sh "$build" "$out/bench" ;;
  torch) step torch 560 bash tests/torch/gpu_run.sh "$build" "$out/torch" ;;
  shim) step shim 420 bash tests/preload/gpu_run.sh "$build" "$out/shim" --one-gpu ;;
  ipc)
    # Each run a job of its own in a private directory, as the script's header asks (env, not a
    # shell function: step runs its command through timeout).
    lib=(TAGMEM_LIBRARY="$build/allocator/libtagmem.so.1" PYTHONPATH="$PWD/integrations/torch")
    step ipc_c 240 env TAGMEM_JOB="gpu-ipc-c-$$" TAGMEM_PEER_DIR="$(mktemp -d)" \
      "$build/tests/ipc/tagmem_ipc_tests"
    for mode in mempool direct global dropin bucket bandwidth cycles; do
      step "ipc_$mode" 300 env TAGMEM_JOB="gpu-ipc-$mode-$$" TAGMEM_PEER_DIR="$(mktemp -d)" \
        "${lib[@]}" TAGMEM_TORCH_LIBRARY="$build/integrations/torch/libtagmem_torch_alloc.so" \
        python3 tests/torch/ipc_torch_gpu.py "$mode"
    done
    step ipc_shim 300 env TAGMEM_JOB="gpu-ipc-shim-$$" TAGMEM_PEER_DIR="$(mktemp -d)" \
      "${lib[@]}" TAGMEM_PRELOAD_TAG=torch \
      LD_PRELOAD="$build/integrations/preload/libtagmem_preload.so" \
      python3 tests/torch/ipc_torch_gpu.py shim
    ;;
  handoff)
    # A job of its own in a private directory, as for ipc above.
    step handoff 240 env TAGMEM_JOB="gpu-handoff-$$" TAGMEM_PEER_DIR="$(mktemp -d)" \
      "$build/tests/handoff/tagmem_handoff_tests" \
      --gtest_filter="$(grep -v '^#' tests/handoff/gpu_filter.txt)"
    step rl_two 300 "$build/benchmarks/tagmem_bench_offload" --scenarios=raw,rl_two_process \
      --rl-variants=default,handoff,overlap,overlap_early --rl-two-shapes=tight,roomy --cycles=3 \
      --tsv="$out/rl_two.tsv"
    # The overlapping variants again with a step between switches, as in an RL loop, and early
    # return with its copies sharing the link beside it giving way (docs/handoff.md, "Giving way").
    step rl_two_step 240 "$build/benchmarks/tagmem_bench_offload" --scenarios=raw,rl_two_process \
      --rl-variants=overlap,overlap_early,overlap_early_shared --rl-two-shapes=tight,roomy --cycles=3 \
      --rl-two-step-ms=500 --tsv="$out/rl_two_step.tsv"
    # The same switch through PyTorch (docs/handoff.md, "The same switch in PyTorch"); the
    # tms_retain row when torch_memory_saver imports.
    step torch_rl_two 400 env TAGMEM_LIBRARY="$build/allocator/libtagmem.so.1" \
      TAGMEM_TORCH_LIBRARY="$build/integrations/torch/libtagmem_torch_alloc.so" \
      PYTHONPATH="$PWD/integrations/torch${PYTHONPATH:+:$PYTHONPATH}" \
      python3 integrations/torch/bench/rl_two.py \
      --methods tagmem_overlap,tagmem_early,tagmem_early_shared,tms_retain \
      --shapes tight,roomy --step-ms 500 --cycles 3
    ;;
  multi)
    step preload 420 bash tests/preload/gpu_run.sh "$build" "$out/preload"
    step fsdp2 150 bash tests/torch/gpu_run.sh "$build" "$out/fsdp2" --two-gpu --only fsdp2
    ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
tail -n 25 "$out"/*.log | tail -c 6000
cat "$out/summary.txt"
[ -n "${OUT:-}" ] && tar -czf "$OUT/$part-logs.tgz" -C "$out" . 2>/dev/null
exit $status
