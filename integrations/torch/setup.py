"""Packaging of the tagmem Python package: ``pip install integrations/torch``.

The package is pure Python and loads libtagmem at run time (see tagmem/_lib.py for where it
looks). To carry the native libraries inside the package, point TAGMEM_BUILD_DIR at a CMake build
of this repository (targets tagmem and tagmem_torch_alloc); the build then copies
libtagmem.so.0 and libtagmem_torch_alloc.so into tagmem/lib/, where the package looks first after
the process and the TAGMEM_LIBRARY / TAGMEM_TORCH_LIBRARY variables.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

_LIBRARIES = {
    "libtagmem.so.0": "allocator/libtagmem.so.0",
    "libtagmem_torch_alloc.so": "integrations/torch/libtagmem_torch_alloc.so",
}
_PRELOAD = "integrations/preload/libtagmem_preload.so"  # optional


class BuildPyWithLibraries(build_py):
    """build_py that also copies the native libraries of TAGMEM_BUILD_DIR, when it is set."""

    def run(self):
        super().run()
        build_dir = os.environ.get("TAGMEM_BUILD_DIR")
        if not build_dir:
            return
        destination = os.path.join(self.build_lib, "tagmem", "lib")
        os.makedirs(destination, exist_ok=True)
        for name, relative in _LIBRARIES.items():
            source = os.path.join(build_dir, relative)
            if not os.path.exists(source):
                raise SystemExit(f"TAGMEM_BUILD_DIR={build_dir}: {relative} is missing; build it first")
            shutil.copyfile(os.path.realpath(source), os.path.join(destination, name))
        # The preload shim, where it was built: configure_subprocess() hands it to children, and
        # torch_memory_saver's callers look for it beside the shim package's directory.
        shim = os.path.join(build_dir, _PRELOAD)
        if os.path.exists(shim):
            shutil.copyfile(os.path.realpath(shim), os.path.join(destination, "libtagmem_preload.so"))
            tms_path = os.path.join(self.build_lib, "tagmem", "compat", "tms_path")
            os.makedirs(tms_path, exist_ok=True)
            shutil.copyfile(
                os.path.realpath(shim),
                os.path.join(tms_path, "torch_memory_saver_hook_mode_preload.abi3.so"),
            )


class MaybeBinaryDistribution(Distribution):
    """With the native libraries inside, the wheel is for this platform, not 'any'."""

    def has_ext_modules(self):
        return bool(os.environ.get("TAGMEM_BUILD_DIR"))


setup(cmdclass={"build_py": BuildPyWithLibraries}, distclass=MaybeBinaryDistribution)
