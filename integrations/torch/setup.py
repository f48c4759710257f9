"""Packaging of the tagmem Python package: ``pip install --no-build-isolation ./integrations/torch``.

The package loads its native libraries at run time (see tagmem/_lib.py for where it looks) and
carries them in tagmem/lib/: libtagmem.so.1, libtagmem_torch_alloc.so (the PyTorch allocator),
libtagmem_preload.so (the LD_PRELOAD shim), libtagmem_emu.so (the emulated driver) and, from a
build configured with -DTAGMEM_BUILD_LIBTORCH=ON, libtagmem_libtorch.so (global mode's libtorch part).

Where they come from:

- TAGMEM_BUILD_DIR set: copied from that CMake build of this repository (the shim and the emulated
  driver only when it has them);
- otherwise: built here with CMake from the repository this directory sits in (library targets
  only, tests and benchmarks off), in setuptools' build directory. This needs cmake, a C++20
  compiler and the CUDA toolkit's headers; TAGMEM_CMAKE_ARGS adds configure arguments (for
  example -DCUDAToolkit_ROOT=/opt/cuda).

``--no-build-isolation`` lets pip use the installed setuptools instead of fetching one from PyPI,
so the install works offline.
"""

import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.dirname(os.path.dirname(_HERE))  # the repository root
# name in tagmem/lib -> (where a build has it, the run path it must carry in the package).
#
# Note [packaged run paths]: a library copied out of a build tree keeps the build's run path: an
# absolute build directory, and often an empty entry, which the loader reads as the current
# directory, so a library planted where the program runs would be loaded in its place. Each staged
# library gets exactly the run path it needs, as `cmake --install` gives it: "$ORIGIN" for those
# that link libtagmem.so.1 (found beside them), none for the self-contained ones.
# tests/torch/test_packaging.py checks every packaged ELF file.
_ORIGIN = "$ORIGIN"
_REQUIRED = {
    "libtagmem.so.1": ("allocator/libtagmem.so.1", _ORIGIN),
    "libtagmem_torch_alloc.so": ("integrations/torch/libtagmem_torch_alloc.so", _ORIGIN),
}
_OPTIONAL = {
    "libtagmem_preload.so": ("integrations/preload/libtagmem_preload.so", ""),
    "libtagmem_emu.so": ("allocator/driver/emu/libtagmem_emu.so", ""),
    # Built only with -DTAGMEM_BUILD_LIBTORCH=ON (against the PyTorch in use): global mode then
    # tracks record_stream and answers torch.cuda.memory_stats() (tagmem/torch/_global.py). Its
    # PyTorch libraries are loaded already whenever it is (PyTorch loads it).
    "libtagmem_libtorch.so": ("integrations/torch/libtorch/libtagmem_libtorch.so", _ORIGIN),
}
_TARGETS = ["tagmem", "tagmem_torch_alloc", "tagmem_preload", "tagmem_emu"]


def _run(command):
    print("tagmem:", shlex.join(command), flush=True)
    subprocess.run(command, check=True)


def _cmake():
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit(
            "tagmem: cmake not found: install it (apt-get install cmake); it builds the libraries "
            "and sets their run paths in the package"
        )
    return cmake


def _stage(source, destination, runpath):
    """Copies library `source` to `destination` with run path `runpath` ("" for none)
    (Note [packaged run paths])."""
    shutil.copyfile(os.path.realpath(source), destination)
    # file(RPATH_SET) rewrites the entry in place; an empty value removes it.
    script = os.path.join(_HERE, "set_runpath.cmake")
    subprocess.run(
        [_cmake(), f"-DFILE={destination}", f"-DRUNPATH={runpath}", "-P", script],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _cmake_build(build_dir):
    """Configures and builds the library targets into build_dir; returns build_dir."""
    if not os.path.exists(os.path.join(_SOURCE, "allocator", "CMakeLists.txt")):
        raise SystemExit(
            f"tagmem: {_SOURCE} is not a tagmem source tree; install from the repository "
            "(pip install ./integrations/torch) or set TAGMEM_BUILD_DIR to a CMake build"
        )
    cmake = _cmake()
    configure = [cmake, "-S", _SOURCE, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        configure += ["-G", "Ninja"]
    # Tests and benchmarks off: their dependencies are not needed to use the package. The
    # libraries carry $ORIGIN as their run path, so they find each other inside the package.
    configure += [
        "-DTAGMEM_BUILD_TESTS=OFF",
        "-DTAGMEM_BUILD_BENCHMARKS=OFF",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    ]
    configure += shlex.split(os.environ.get("TAGMEM_CMAKE_ARGS", ""))
    _run(configure)
    build = [cmake, "--build", build_dir, "--target", *_TARGETS]
    if not os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        build += ["--parallel", str(os.cpu_count() or 1)]
    _run(build)
    return build_dir


class BuildPyWithLibraries(build_py):
    """build_py that also puts the native libraries into tagmem/lib/."""

    def run(self):
        super().run()
        build_dir = os.environ.get("TAGMEM_BUILD_DIR")
        if not build_dir:
            build_temp = self.get_finalized_command("build").build_temp
            build_dir = _cmake_build(os.path.abspath(os.path.join(build_temp, "tagmem-cmake")))
        destination = os.path.join(self.build_lib, "tagmem", "lib")
        os.makedirs(destination, exist_ok=True)
        for name, (relative, runpath) in _REQUIRED.items():
            source = os.path.join(build_dir, relative)
            if not os.path.exists(source):
                raise SystemExit(f"TAGMEM_BUILD_DIR={build_dir}: {relative} is missing; build it first")
            _stage(source, os.path.join(destination, name), runpath)
        for name, (relative, runpath) in _OPTIONAL.items():
            source = os.path.join(build_dir, relative)
            if os.path.exists(source):
                _stage(source, os.path.join(destination, name), runpath)
        # The preload shim under torch_memory_saver's file name: its callers look for it beside
        # the shim package's directory.
        shim = os.path.join(destination, "libtagmem_preload.so")
        if os.path.exists(shim):
            tms_path = os.path.join(self.build_lib, "tagmem", "compat", "tms_path")
            os.makedirs(tms_path, exist_ok=True)
            shutil.copyfile(shim, os.path.join(tms_path, "torch_memory_saver_hook_mode_preload.abi3.so"))


class BinaryDistribution(Distribution):
    """With the native libraries inside, the wheel is for this platform, not 'any'."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibraries}, distclass=BinaryDistribution)
