#!/usr/bin/env bash
# gpu_run.sh — every offload/pinning/allocation benchmark on one GPU, in a few minutes, with full logs in <out-dir> and a compact table printed last.
#
#   bash benchmarks/gpu_run.sh <build-dir> <out-dir>
#
# Runs, in order (each program verifies its own bytes; any failure makes the exit status 1):
#   1. tagmem_bench_pinning       how to pin the host store (docs/performance.md, "Pinning"),
#      tagmem_bench_shared_host   then host memory shared by two processes (a replicated tag's
#                                 host copy): memfd + register against host-located cuMem
#   2. tagmem_bench_vmm           what one physical mapping costs, by size ("Mapping costs")
#   3. tagmem_bench_offload       raw link, weights (+pre-pinned), many small, kv cache, swap
#                                 (roomy and memory-tight): the scenario table
#   4. tagmem_bench_link_anatomy  where the swap's bidirectional rate goes: the raw link with
#                                 tagmem's differences (pieces, vmm, remapping) added one at a time
#   5. chunking sweeps            tagmem_bench_offload again with TAGMEM_COPY_PIECE_BYTES,
#                                 TAGMEM_MAX_MAPPING_BYTES, TAGMEM_DISCARD_MAPPING_BYTES,
#                                 TAGMEM_CHUNK_BYTES, TAGMEM_HOST_PIN and TAGMEM_SWAP_RELEASE
#                                 varied
#   6. tagmem_bench_random_allocations   cuMemAllocAsync vs tagmem with mimalloc
#                                 or system metadata
#   7. the RL cycle               tagmem_bench_offload's rl_cycle, one process per variant, the
#                                 copy kernel's A/B alternated twice, then keep, kernel_always and
#                                 no_kv; rl_two_process with and without the copy kernel; and
#                                 tagmem_bench_release_aftermath's copy against kcopy after a
#                                 release ("RL cycle", "After a release")
#
# Every scenario runner's --tsv=<name>.tsv also writes <name>.json beside it, in the shape of
# Google Benchmark's --benchmark_out JSON (random_allocations.json), for plots and docs.
#
# Knobs (environment):
#   TAGMEM_LIBCUDA        set: run on that driver (the emulator); the defaults then shrink
#   TAGMEM_BENCH_SCALE    size factor (default 1 on a GPU, 0.01 with TAGMEM_LIBCUDA set)
#   TAGMEM_GPU_RUN_SKIP   comma list of parts to skip: pinning,vmm,offload,anatomy,sweeps,random,rl
# The programs need libbenchmark.so and libmimalloc.so.2 where the loader finds them (e.g. a lib
# folder on LD_LIBRARY_PATH); nothing else outside <build-dir>.
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: bash $0 <build-dir> <out-dir>" >&2
  exit 2
fi
build=$(cd "$1" && pwd) || exit 2
out=$2
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
bench="$build/benchmarks"
for b in tagmem_bench_pinning tagmem_bench_shared_host tagmem_bench_vmm tagmem_bench_offload \
    tagmem_bench_link_anatomy tagmem_bench_random_allocations tagmem_bench_release_aftermath; do
  [[ -x "$bench/$b" ]] || { echo "missing $bench/$b: build the benchmarks first" >&2; exit 2; }
done

export NCCL_NVLS_ENABLE=0
if [[ -n "${TAGMEM_LIBCUDA:-}" ]]; then
  scale=${TAGMEM_BENCH_SCALE:-0.01}
  driver="emulated ($TAGMEM_LIBCUDA)"
else
  scale=${TAGMEM_BENCH_SCALE:-1}
  driver="real (libcuda.so.1)"
fi
skip=",${TAGMEM_GPU_RUN_SKIP:-},"
# Sizes from the scale: GiB-based knobs in MiB so that bash can multiply them.
mib() { awk -v s="$scale" -v m="$1" -v lo="$2" 'BEGIN { v = int(s * m); if (v < lo) v = lo; print v "M" }'; }
pin_bytes=$(mib 4096 64)
vmm_bytes=$(mib 8192 256)
failures=()
start_all=$(date +%s)

run() {  # run <name> <command...>: logs to $out/<name>.log, records a failure
  local name=$1
  shift
  local t0=$(date +%s)
  echo "== $name: $*" | tee "$out/$name.log"
  "$@" >>"$out/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $(($(date +%s) - t0)) s" | tee -a "$out/$name.log"
  ((rc == 0)) || failures+=("$name (exit $rc)")
  return $rc
}
wanted() { [[ $skip != *",$1,"* ]]; }

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host: $(hostname); driver: $driver; scale: $scale"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpus: $(nproc); memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
} | tee "$out/machine.txt"

if wanted pinning; then
  run pinning "$bench/tagmem_bench_pinning" --bytes="$pin_bytes" --threads=1,8,16 \
    --tsv="$out/pinning.tsv"
  run shared_host "$bench/tagmem_bench_shared_host" --bytes="$(mib 16384 64)" \
    --tsv="$out/shared_host.tsv"
fi
if wanted vmm; then
  run vmm "$bench/tagmem_bench_vmm" --bytes="$vmm_bytes" --sizes=2M,20M,64M,512M,1G,4G \
    --threads=4 --tsv="$out/vmm.tsv"
  # The kv-cache size (60 GiB) in large chunks: what a DISCARD reload and release cost.
  run vmm_kv "$bench/tagmem_bench_vmm" --bytes="$(mib 61440 512)" --sizes=1G,4G,15G,30G,60G \
    --threads=4 --tsv="$out/vmm_kv.tsv"
fi

link=""
if wanted offload; then
  run offload "$bench/tagmem_bench_offload" --scale="$scale" --cycles=5 --swap-cycles=3 \
    --tsv="$out/offload.tsv"
  link=$(awk -F'\t' '$2 == "ceiling GB/s H2D,D2H,bidir" { print $3 }' "$out/offload.tsv" 2>/dev/null)
fi
if wanted anatomy; then
  run anatomy "$bench/tagmem_bench_link_anatomy" --bytes="$(mib 16384 64)" --tsv="$out/anatomy.tsv"
fi

if wanted sweeps; then
  linkarg=()
  [[ -n $link ]] && linkarg=(--link="$link")
  sweep() {  # sweep <name> <env assignment> <scenarios>
    run "sweep_$1" env "$2" "$bench/tagmem_bench_offload" --scale="$scale" --cycles=3 \
      --scenarios="$3" "${linkarg[@]}" --tsv="$out/sweep_$1.tsv"
  }
  for p in 16M 256M; do sweep "piece_$p" TAGMEM_COPY_PIECE_BYTES=$p weights_prepinned; done
  for m in 256M 4G; do sweep "maxmap_$m" TAGMEM_MAX_MAPPING_BYTES=$m weights_prepinned; done
  for m in 4G 16G 64G; do sweep "discard_map_$m" TAGMEM_DISCARD_MAPPING_BYTES=$m kv; done
  for c in 8M 32M; do sweep "chunk_$c" TAGMEM_CHUNK_BYTES=$c many_small; done
  sweep pin_host_alloc TAGMEM_HOST_PIN=host_alloc weights
  # The out-side of a swap released while its copies run, against the default (after them, on
  # the release thread; Note [background release]) in the offload part above.
  sweep swap_release_inline TAGMEM_SWAP_RELEASE=inline swap,swap_tight
fi

if wanted random; then
  ra=("$bench/tagmem_bench_random_allocations" --benchmark_min_time=0.1
      --benchmark_out="$out/random_allocations.json" --benchmark_out_format=json)
  if [[ -n "${TAGMEM_LIBCUDA:-}" ]]; then
    export TAGMEM_BENCH_LIVE_BYTES=${TAGMEM_BENCH_LIVE_BYTES:-512M}
    ra+=(--benchmark_filter='/(1000|10000)/(1|1024)/')
  fi
  if run random_allocations "${ra[@]}" && ! grep -q '"name"' "$out/random_allocations.json"; then
    failures+=("random_allocations (no benchmark ran)")
  fi
fi

if wanted rl; then
  # Each variant in a process of its own: a variant that follows another in one process inherits
  # its pinned store and the driver's state after its releases.
  n=0
  for v in copy_engines default copy_engines default keep kernel_always no_kv; do
    n=$((n + 1))
    run "rl_${n}_$v" "$bench/tagmem_bench_offload" --scale="$scale" --cycles=5 \
      --scenarios=raw,rl_cycle --rl-variants="$v" --tsv="$out/rl_${n}_$v.tsv"
  done
  for k in after_release off; do
    run "rl_two_$k" env TAGMEM_COPY_KERNEL=$k "$bench/tagmem_bench_offload" --scale="$scale" \
      --cycles=5 --scenarios=raw,rl_two_process --tsv="$out/rl_two_$k.tsv"
  done
  after="create map use sleep1000 unmap release"
  run aftermath "$bench/tagmem_bench_release_aftermath" --copy="$(mib 16384 64)" \
    --released="$(mib 61440 256)" --mapping="$(mib 16384 64)" --repeats=2 \
    --sequences="copy;kcopy;$after copy;$after kcopy;$after sleep250 copy" \
    --tsv="$out/aftermath.tsv"
fi

# ---- summary -----------------------------------------------------------------------------
echo
echo "################ tagmem GPU benchmark summary ################"
cat "$out/machine.txt"
echo "command: bash benchmarks/gpu_run.sh $1 $2   (total $(($(date +%s) - start_all)) s)"
show_tsv() {  # show_tsv <title> <file> [awk filter on the metric]
  [[ -f $2 ]] || return 0
  echo
  echo "--- $1"
  awk -F'\t' -v pat="${3:-.}" 'NR > 1 && $2 ~ pat { printf "%-26s | %-50s | %-28s | %s\n", $1, $2, $3, $4 }' "$2"
}
show_tsv "offload scenarios" "$out/offload.tsv"
show_tsv "link anatomy (the swap's copies, one difference from the raw link at a time)" \
  "$out/anatomy.tsv"
for f in "$out"/sweep_*.tsv; do
  [[ -f $f ]] || continue
  n=$(basename "$f" .tsv)
  show_tsv "$n" "$f" 'steady|cycle 1 /|offload ms|reload ms|swap /|ERROR'
done
for f in "$out"/rl_*.tsv; do
  [[ -f $f ]] || continue
  show_tsv "$(basename "$f" .tsv)" "$f" 'steady|ceiling|ERROR'
done
show_tsv "release aftermath (copy engines against the copy kernel)" "$out/aftermath.tsv"
show_tsv "pinning $pin_bytes (time to pin; copy rates into the pinned memory)" "$out/pinning.tsv"
show_tsv "shared host memory $(mib 16384 64) (make and open across two processes; copy rates)" \
  "$out/shared_host.tsv"
show_tsv "vmm costs over $vmm_bytes" "$out/vmm.tsv" 'us per chunk|ms all|one |threads'
show_tsv "vmm costs over 60 GiB" "$out/vmm_kv.tsv" 'us per chunk|ms all|one |threads|never'
if [[ -f "$out/random_allocations.json" ]]; then
  echo
  echo "--- random_allocations (ms per sequence, real time; lower is better)"
  python3 - "$out/random_allocations.json" <<'EOF' || awk '/^BM_/' "$out/random_allocations.log"
import json, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") == "aggregate" or b.get("error_occurred"):
        continue
    _, alloc, count, kib = b["name"].split("/")[:4]
    rows.setdefault((int(count), int(kib)), {})[alloc] = b["real_time"]
names = ["cuda_async", "tagmem_mimalloc", "tagmem_system"]
print("%-22s" % "allocations x max" + "".join("%18s" % n for n in names) + "   system/mimalloc")
for (count, kib), r in sorted(rows.items()):
    ratio = r.get("tagmem_system", 0) / r["tagmem_mimalloc"] if r.get("tagmem_mimalloc") else 0
    print("%-22s" % ("%d x %d KiB" % (count, kib)) +
          "".join("%18s" % ("%.3f" % r[n] if n in r else "-") for n in names) + "   %.2f" % ratio)
EOF
fi
echo
if ((${#failures[@]})); then
  echo "FAILED: ${failures[*]} (logs in $out)"
  exit 1
fi
echo "all parts passed (logs in $out)"
