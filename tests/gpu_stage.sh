#!/usr/bin/env bash
# Stages a build for the GPU machine: copies <build-dir> without object files into
# .carry/build, and the shared libraries the binaries load that the GPU image lacks (mimalloc,
# Google Benchmark) into .carry/lib. Carry ".carry" and run tests/gpu_all.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rm -rf .carry && mkdir -p .carry/lib
rsync -a --exclude '*.o' --exclude '*.a' --exclude 'CMakeFiles/' --exclude '.ninja_*' \
  --exclude 'Testing/' "$build/" .carry/build/
for lib in libmimalloc.so.2 libbenchmark.so.1debian; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" .carry/lib/
done
# Debug info would take the staged tree past what travels to the device machine (64 MiB).
find .carry -type f \( -perm -u+x -o -name "*.so*" \) -exec sh -c 'file "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
du -sh .carry
