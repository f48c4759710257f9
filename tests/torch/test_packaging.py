"""What setup.py puts into the package from a CMake build (TAGMEM_BUILD_DIR): every ELF file
carries the run path it needs and no other (setup.py: Note [packaged run paths]), so nothing in
the current directory or the build machine's directories is ever loaded in its place.

Needs TEST_BUILD_DIR, the CMake build the package is made from (ctest sets it); runs on the
emulated driver in CI.
"""

import filecmp
import os
import shutil
import subprocess
import sys

import elf_runpath
from conftest import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "integrations", "torch")


def build_dir():
    path = os.environ.get("TEST_BUILD_DIR")
    assert path, "set TEST_BUILD_DIR to the CMake build (ctest does)"
    return path


def staged_package(tmp_path):
    """Runs setup.py build from a copy of the package source (builds write into their source
    tree); returns the directory that holds the built tagmem package."""
    source = tmp_path / "source"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "*.so"))
    env = dict(os.environ, TAGMEM_BUILD_DIR=build_dir())
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build", "--build-base", str(tmp_path / "out"),
         "--build-lib", str(tmp_path / "out" / "lib")],
        cwd=source, env=env, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path / "out" / "lib"


def test_every_packaged_library_has_exactly_the_run_path_it_needs(tmp_path):
    lib = staged_package(tmp_path)
    files = list(elf_runpath.elf_files(lib))
    names = {os.path.basename(f) for f in files}
    assert {"libtagmem.so.1", "libtagmem_torch_alloc.so"} <= names, names
    for path in files:
        assert elf_runpath.offences(path) == [], path
    needs = elf_runpath.dynamic_entries(str(lib / "tagmem" / "lib" / "libtagmem_torch_alloc.so"))
    assert needs["RUNPATH"] == ["$ORIGIN"]
    # Where slime looks for the hook library (beside the torch_memory_saver package directory):
    # a copy of the shim, made when the package is built, never at run time.
    shim = lib / "tagmem" / "lib" / "libtagmem_preload.so"
    if shim.exists():
        tms_copy = lib / "tagmem" / "compat" / "tms_path" / "torch_memory_saver_hook_mode_preload.abi3.so"
        assert filecmp.cmp(tms_copy, shim, shallow=False)


def test_the_build_tree_libraries_are_what_the_check_is_for():
    # The check must be able to fail: the build tree's own copies carry the build's run paths.
    source = os.path.join(build_dir(), "integrations", "torch", "libtagmem_torch_alloc.so")
    assert elf_runpath.offences(os.path.realpath(source)) != []
