#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (with the CUDA 13 toolkit installed) and runs every test that
# needs no GPU: the emulator's own suite, the core suite, the integrations' emulator tests, the
# Python tests, the install checks, then the sanitizer and fuzzer runs. Exits non-zero on the first
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ clang-14 libclang-rt-14-dev pkg-config \
  libmimalloc-dev libgtest-dev libgmock-dev googletest libbenchmark-dev \
  python3 python3-pytest python3-venv python3-pip python3-setuptools python3-wheel \
  python3-matplotlib abigail-tools >/dev/null

jobs=$(nproc)
logs=$(mktemp -d)
# What each stage costs, printed at the end (docs/reliability.md keeps the figures of a CI run).
costs=()
t0=$SECONDS
stage_done() { costs+=("$(printf '%-22s %5ds' "$1" $((SECONDS - t0)))"); t0=$SECONDS; }
stage_done "apt"
# Full debug information: the ABI check (abidiff) reads libtagmem's types from it.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
stage_done "build"
(cd build && ctest -L emu --output-on-failure -j "$jobs" --timeout 900) | tee "$logs/emu.log"
stage_done "emulator tests"

# Installs as the README describes them (library-only build, cmake --install and a consumer
# project, pip in a fresh virtual environment), and `ctest -L gpu` here: skipped, not failed.
bash tests/install/check.sh build | tee "$logs/install.log"
stage_done "install checks"

# Sanitizers and the bounded fuzzer run (see docs/reliability.md).
bash tests/sanitizers.sh | tee "$logs/sanitizers.log"
stage_done "sanitizers"

# One closing line for the whole run: every stage above passed (set -e and pipefail stop at the
# first failure), so "passed" is what each stage ran and "skipped" the GPU tests this machine
# cannot run.
out_of() { sed -nE "s/^$1.* tests failed out of ([0-9]+).*/\1/p" "$2" | tail -1; }
emu=$(out_of "100% tests passed" "$logs/emu.log")
gpu_skipped=$(sed -nE 's/^GPU tests registered: ([0-9]+); without a GPU every one skipped.*/\1/p' "$logs/install.log")
asan=$(out_of "asan\+ubsan: 100% tests passed" "$logs/sanitizers.log")
tsan=$(sed -nE 's/^tsan: ([0-9]+) threaded tests passed.*/\1/p' "$logs/sanitizers.log")
fuzzers=$(grep -Ec '^(fuzzer|rendezvous fuzzer): stat::' "$logs/sanitizers.log" || true)
echo "---- stage costs (seconds; the sanitizer summary above splits its stage) ----"
printf '%s\n' "${costs[@]}"
echo "emu ${emu:-0}, install checks 1, asan+ubsan ${asan:-0}, tsan ${tsan:-0}, fuzzers ${fuzzers:-0}; GPU tests skipped ${gpu_skipped:-0}"
echo "ci: $(( ${emu:-0} + 1 + ${asan:-0} + ${tsan:-0} + ${fuzzers:-0} )) passed, 0 failed, ${gpu_skipped:-0} skipped"
