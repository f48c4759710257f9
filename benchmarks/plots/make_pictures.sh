#!/usr/bin/env bash
# Runs the demo with TAGMEM_TRACE and draws its pictures: the one command behind the timeline and
# memory plots in README and docs/performance.md.
#   make_pictures.sh DEMO OUT_DIR [demo arguments...]
# On a GPU machine: bash benchmarks/plots/make_pictures.sh build/benchmarks/demo/tagmem_demo docs/img
# Writes OUT_DIR/trace.json (open it in https://ui.perfetto.dev or chrome://tracing),
# OUT_DIR/phase_switch.png and OUT_DIR/memory.png, and checks that both PNGs are PNGs.
set -euo pipefail
demo=$1
out=$2
shift 2
python=${TAGMEM_PYTHON_FOR_PLOTS:-python3}
mkdir -p "$out"
rm -f "$out/trace.json" "$out/phase_switch.png" "$out/memory.png"
TAGMEM_TRACE="$out/trace.json" "$demo" "$@"
"$python" "$(dirname "$0")/trace_timeline.py" "$out/trace.json" --out "$out"
for f in phase_switch.png memory.png; do
  if [ "$(head -c 8 "$out/$f" | od -An -tx1 | tr -d ' \n')" != "89504e470d0a1a0a" ]; then
    echo "make_pictures: $out/$f is not a PNG" >&2
    exit 1
  fi
done
