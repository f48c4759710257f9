#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (with the CUDA 13 toolkit installed), builds tagmem and runs the
# demo: on the GPU if one is present, else on the emulated driver (it says which on its first line).
# Extra arguments go to the demo (--cycles N, --scale S).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ libmimalloc-dev libgtest-dev libbenchmark-dev >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target tagmem_demo tagmem_emu -j "$(nproc)"
exec ./build/benchmarks/demo/tagmem_demo "$@"
