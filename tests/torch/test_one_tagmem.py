"""One tagmem per process (Note [one tagmem per process] in tagmem/_lib.py): the package uses a
libtagmem another module loaded privately, and under the preload shim the libraries that link
libtagmem map no second copy of it. Both ways a library is found are covered: the package's own
lookup (ctypes, RTLD_NOLOAD) and the dynamic loader's, through DT_NEEDED.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import tagmem
from tagmem import _entry_points, _preload

MAPPED = """
    def mapped(prefix):
        out = set()
        for line in open("/proc/self/maps"):
            path = line.split()[-1] if "/" in line else ""
            if os.path.basename(path).startswith(prefix):
                out.add(path)
        return sorted(out)
"""


def run_child(code, env_changes, cwd):
    env = dict(os.environ)
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(MAPPED) + textwrap.dedent(code)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_libtagmem_another_module_loaded_privately_is_the_one_used(tmp_path):
    # An extension module that links libtagmem loads it RTLD_LOCAL: invisible to a global lookup.
    private = tmp_path / "extension" / "libtagmem.so.1"
    private.parent.mkdir()
    shutil.copyfile(tagmem.library_file(), private)
    child = run_child(
        f"""
        import ctypes, json, os
        ctypes.CDLL({str(private)!r}, mode=os.RTLD_LOCAL)
        import tagmem
        with tagmem.tag("one"):
            p = tagmem.raw_alloc(4096)
        print(json.dumps({{"file": tagmem.library_file(), "origin": tagmem.library_origin(),
                           "copies": mapped("libtagmem.so")}}))
        """,
        {"TAGMEM_LIBRARY": tagmem.library_file()},
        tmp_path,
    )
    assert child["file"] == str(private) and child["origin"] == "loaded", child
    assert child["copies"] == [str(private)], child


def test_under_the_shim_the_entry_points_map_no_second_libtagmem(tmp_path):
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    child = run_child(
        """
        import ctypes, json, os
        import tagmem
        from tagmem import _entry_points
        entry = _entry_points.handle()
        with tagmem.tag("weights"):
            p = tagmem.raw_alloc(4096)
        print(json.dumps({"origin": tagmem.library_origin(), "copies": mapped("libtagmem.so"),
                          "entry": _entry_points.path()}))
        """,
        {"LD_PRELOAD": shim, "TAGMEM_TORCH_LIBRARY": _entry_points.path()},
        tmp_path,
    )
    assert child["origin"] == "process", child
    assert child["copies"] == [], child  # DT_NEEDED libtagmem.so.1 was answered by the shim
