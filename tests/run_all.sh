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
  python3 python3-pytest python3-venv python3-pip python3-setuptools python3-wheel >/dev/null

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
(cd build && ctest -L emu --output-on-failure -j "$jobs" --timeout 900)

# Installs as the README describes them (library-only build, cmake --install and a consumer
# project, pip in a fresh virtual environment), and `ctest -L gpu` here: skipped, not failed.
bash tests/install/check.sh build

# Sanitizers and the bounded fuzzer run (see docs/reliability.md).
if [ -f tests/sanitizers.sh ]; then
  bash tests/sanitizers.sh
fi
