#!/usr/bin/env bash
# Installs tagmem the ways the README describes and uses each result as a user would, on a machine
# without a GPU (the emulated driver stands in). Called by tests/run_all.sh.
#   1. `cmake --install` into a temporary prefix — of the build given as the argument, else of a
#      library-only CMake build made here — and tests/install/consumer built against it with
#      find_package(tagmem) and with pkg-config; the consumer added as a subproject of tagmem's
#      tree configures without tests, benchmarks and their dependencies;
#   2. `pip wheel ./integrations/torch` (the package builds its native libraries itself) and the
#      wheel's contents, then that wheel installed into a fresh virtual environment — what
#      `pip install ./integrations/torch` does — and `python -m tagmem`, a tag API call on the
#      packaged emulated driver, every packaged ELF file's run path;
#   3. nothing left untracked in the source tree by any of it;
#   4. with a build directory argument: `ctest -L gpu` there skips every GPU test, fails none.
# Usage: tests/install/check.sh [build-dir]   (PYTHON selects the interpreter, default /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
build=${1:-}
# Debian's interpreter by default: run_all.sh installs its pip, setuptools and wheel with apt
# (another python3 first on PATH may lack them).
python=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
jobs=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "install check: FAIL: $*" >&2; exit 1; }
step() { echo "== install check: $*"; }

# What the user's project does not have to provide.
no_deps=(-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_mimalloc=ON -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_Python3=ON)
git_tree=0
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git_tree=1
  untracked_before=$(git -C "$repo" status --porcelain --untracked-files=all)
fi

# A library-only build (tests, benchmarks and their dependencies made unfindable) is what step 2's
# package makes too, so with a build given, that one is installed instead of building a third time.
if [ -n "$build" ]; then
  step "cmake --install of $build"
  installed_from=$build
else
  step "library-only build, cmake --install"
  cmake --no-warn-unused-cli -S . -B "$work/lib" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAGMEM_BUILD_TESTS=OFF \
    -DTAGMEM_BUILD_BENCHMARKS=OFF "${no_deps[@]}" >/dev/null
  cmake --build "$work/lib" -j "$jobs" >/dev/null
  installed_from=$work/lib
fi
cmake --install "$installed_from" --prefix "$work/prefix" >/dev/null  # a prefix chosen only now
libdir=$(find "$work/prefix" -name libtagmem.so.1 -printf '%h\n' | head -n1)
[ -n "$libdir" ] || fail "cmake --install put no libtagmem.so.1 under $work/prefix"
emu=$libdir/libtagmem_emu.so
for f in "$libdir/libtagmem_preload.so" "$libdir/libtagmem_torch_alloc.so" "$emu" \
  "$libdir/pkgconfig/tagmem.pc" "$libdir/cmake/tagmem/tagmemConfig.cmake" \
  "$work/prefix/include/tagmem/tagmem.h"; do
  [ -f "$f" ] || fail "cmake --install did not install $f"
done

step "consumer project: find_package(tagmem)"
cmake -S tests/install/consumer -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  >/dev/null
cmake --build "$work/consumer" >/dev/null
TAGMEM_LIBCUDA=$emu "$work/consumer/consumer"

step "consumer program: pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
# shellcheck disable=SC2046
cc -o "$work/consumer-pc" tests/install/consumer/main.c $(pkg-config --cflags --libs tagmem) \
  -Wl,-rpath,"$(pkg-config --variable=libdir tagmem)"
TAGMEM_LIBCUDA=$emu "$work/consumer-pc"

step "consumer project: tagmem's tree as a subproject (configure only)"
cmake --no-warn-unused-cli -S tests/install/consumer -B "$work/subproject" -G Ninja -DTAGMEM_SOURCE_DIR="$repo" \
  "${no_deps[@]}" >/dev/null
if grep -q "add_test\|subdirs" "$work/subproject/tagmem/CTestTestfile.cmake" 2>/dev/null ||
  [ -d "$work/subproject/tagmem/tests" ] || [ -d "$work/subproject/tagmem/benchmarks" ]; then
  fail "tagmem added as a subproject configured its tests or benchmarks"
fi

"$python" -m venv --system-site-packages "$work/venv"
venv_python=$work/venv/bin/python
# The package must build its own libraries and use its own copies: none of the variables that
# point it elsewhere.
clean_env=(env -u TAGMEM_BUILD_DIR -u TAGMEM_LIBRARY -u TAGMEM_TORCH_LIBRARY -u TAGMEM_PRELOAD_LIBRARY
  -u TAGMEM_LIBCUDA -u PYTHONPATH -u LD_PRELOAD)

# `pip install ./integrations/torch` builds this same wheel and installs it: the wheel is built
# once here and installed, so the package's native libraries compile once, not twice.
step "pip wheel"
"${clean_env[@]}" TAGMEM_CMAKE_ARGS="${no_deps[*]}" "$venv_python" -m pip wheel -q \
  --no-build-isolation --no-index --no-deps -w "$work/wheels" ./integrations/torch
"$venv_python" - "$work/wheels" <<'EOF'
import os, sys, zipfile
wheels = os.listdir(sys.argv[1])
assert len(wheels) == 1 and not wheels[0].endswith("-any.whl"), wheels
names = set(zipfile.ZipFile(os.path.join(sys.argv[1], wheels[0])).namelist())
for lib in ("libtagmem.so.1", "libtagmem_torch_alloc.so", "libtagmem_preload.so", "libtagmem_emu.so"):
    assert f"tagmem/lib/{lib}" in names, (lib, sorted(n for n in names if "/lib/" in n))
assert "tagmem/__main__.py" in names
print(f"wheel: {wheels[0]} carries the four native libraries")
EOF

step "pip install into a fresh virtual environment"
"${clean_env[@]}" "$venv_python" -m pip install -q --no-index "$work/wheels"/*.whl
cd "$work"  # away from the source tree, so only the installed package can be imported
shim=$("${clean_env[@]}" "$venv_python" -m tagmem preload-path)
case $shim in
  "$work/venv/"*/tagmem/lib/libtagmem_preload.so) ;;
  *) fail "python -m tagmem preload-path printed '$shim', not the shim inside the venv" ;;
esac
package_lib=$(dirname "$shim")
for f in libtagmem.so.1 libtagmem_torch_alloc.so libtagmem_emu.so; do
  [ -f "$package_lib/$f" ] || fail "the installed package has no $f"
done
# Every packaged ELF file's run path is exactly what it needs (Note [packaged run paths]).
"$venv_python" "$repo/tests/torch/elf_runpath.py" "$(dirname "$package_lib")" ||
  fail "a library in the installed package has a run path it must not have"
"${clean_env[@]}" TAGMEM_LIBCUDA="$package_lib/libtagmem_emu.so" "$venv_python" - "$package_lib" \
  "$repo/tests/torch" <<'EOF'
import os, random, sys
import tagmem
from tagmem import _entry_points

package_lib = sys.argv[1]
sys.path.append(sys.argv[2])  # device_io: driver copies, for the bytes
from device_io import DeviceIO

rng = random.SystemRandom()
nbytes = rng.randrange(1, 64) << 16
data = rng.randbytes(nbytes)
with tagmem.tag("pip"):
    ptr = tagmem.raw_alloc(nbytes)
assert tagmem.library_file() == os.path.realpath(os.path.join(package_lib, "libtagmem.so.1"))
assert os.path.dirname(_entry_points.path()) == package_lib, _entry_points.path()
io = DeviceIO(0)
io.write(ptr, data)
tagmem.offload("pip")
assert tagmem.state("pip") == "offloaded_backup", tagmem.state("pip")
tagmem.reload("pip")
assert tagmem.pointer_info(ptr)["tag"] == "pip", tagmem.pointer_info(ptr)
assert io.read(ptr, nbytes) == data, "bytes changed across offload and reload"
tagmem.raw_free(ptr)
print(f"pip package: tag API ok on the emulated driver ({nbytes} bytes)")
EOF
routed=$("${clean_env[@]}" "$venv_python" -m tagmem run -- "$venv_python" -c \
  "import ctypes; print(hasattr(ctypes.CDLL(None), 'tagmem_preload_set_thread_routing'))")
[ "$routed" = True ] || fail "python -m tagmem run did not start the command under the shim"
cd "$repo"

if [ "$git_tree" = 1 ]; then
  step "nothing left untracked"
  untracked_after=$(git -C "$repo" status --porcelain --untracked-files=all)
  [ "$untracked_before" = "$untracked_after" ] ||
    fail "the installs changed 'git status':"$'\n'"$(diff <(echo "$untracked_before") <(echo "$untracked_after"))"
else
  echo "== install check: not a git checkout: the untracked-files check did NOT run"
fi

if [ -n "$build" ]; then
  step "ctest -L gpu in $build"
  launch=$build/tests/tagmem_gpu_launch
  log=$work/ctest-gpu.log
  (cd "$build" && ctest -L gpu) >"$log" 2>&1 || { cat "$log"; fail "ctest -L gpu failed"; }
  total=$(grep -Ec "^ *[0-9]+/[0-9]+ Test +#[0-9]+:" "$log" || true)
  [ "$total" -gt 0 ] || { cat "$log"; fail "ctest -L gpu ran no test"; }
  skipped=$(grep -Ec "Test +#[0-9]+: .*Skipped" "$log" || true)
  no_gpu=0
  "$launch" true 2>/dev/null || no_gpu=$?
  if [ "$no_gpu" = 77 ]; then
    [ "$skipped" = "$total" ] || { cat "$log"; fail "no GPU here, yet $skipped of $total GPU tests were skipped"; }
    # Only a count: ctest's own closing lines would read as a run that executed nothing.
    echo "GPU tests registered: $total; without a GPU every one skipped itself (log: $log)"
  else
    cat "$log"
  fi
fi
echo "== install check: all passed"
