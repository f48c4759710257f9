"""The preload shim on LD_PRELOAD is never silently absent and never there twice (Note [a shim that
is silently absent] in tagmem/_preload.py): paths the loader would split are refused, relative
ones made absolute, a process whose LD_PRELOAD named the shim but that lacks it fails at its first
tagmem call, and a copy of the shim already on LD_PRELOAD is not loaded a second time.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
TAGMEM_PRELOAD_LIBRARY names libtagmem_preload.so (ctest and gpu_run.sh set it).
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import tagmem
from conftest import loaded_libc
from tagmem import _preload
from tagmem.compat import _tms_env

HERE = os.path.dirname(os.path.abspath(__file__))

# What a child reports: whether the shim is loaded, how many shim files are mapped, where its
# libtagmem came from, or the error its first tagmem call raised.
CHILD = """
    import ctypes, json, os, tagmem
    mapped = set()
    for line in open("/proc/self/maps"):
        path = line.split()[-1] if "/" in line else ""
        name = os.path.basename(path)
        if name in ("libtagmem_preload.so", "torch_memory_saver_hook_mode_preload.abi3.so"):
            mapped.add(path)
    out = {"shim": hasattr(ctypes.CDLL(None), "tagmem_preload_set_thread_routing"),
           "mapped": sorted(mapped)}
    try:
        out["origin"] = tagmem.library_origin()
    except tagmem.LibraryNotFound as e:
        out["error"] = str(e)
    print(json.dumps(out))
"""


def get_binary_path_from_package(stem):
    """torch_memory_saver.utils's function as the drop-in's shim package has it."""
    path = os.path.join(_tms_env.shim_path(), "torch_memory_saver", "utils.py")
    spec = importlib.util.spec_from_file_location("tms_utils_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_binary_path_from_package(stem)


def run_child(env_changes, cwd):
    env = dict(os.environ)
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def shim():
    path = _preload.library()
    assert path, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    return path


@pytest.fixture
def preload_env(monkeypatch):
    """TAGMEM_PRELOAD_LIBRARY and LD_PRELOAD restored after the test."""
    for v in ("TAGMEM_PRELOAD_LIBRARY", "LD_PRELOAD"):
        if v in os.environ:
            monkeypatch.setenv(v, os.environ[v])
        else:
            monkeypatch.delenv(v, raising=False)
    return monkeypatch


@pytest.mark.parametrize("directory", ["with space", "with:colon"])
def test_a_shim_path_the_loader_would_split_is_refused(shim, preload_env, tmp_path, directory):
    copy = tmp_path / directory / "libtagmem_preload.so"
    copy.parent.mkdir()
    shutil.copyfile(shim, copy)
    preload_env.setenv("TAGMEM_PRELOAD_LIBRARY", str(copy))
    with pytest.raises(ValueError, match="splits LD_PRELOAD"):
        with _tms_env.configure_subprocess():
            pass
    with pytest.raises(RuntimeError, match="splits LD_PRELOAD"):
        get_binary_path_from_package("torch_memory_saver_hook_mode_preload")
    done = subprocess.run([sys.executable, "-m", "tagmem", "run", "--", "true"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "splits LD_PRELOAD" in done.stderr


def test_a_relative_shim_path_reaches_a_child_started_elsewhere(shim, preload_env, tmp_path):
    os.chdir(os.path.dirname(shim))
    try:
        preload_env.setenv("TAGMEM_PRELOAD_LIBRARY", os.path.join(".", os.path.basename(shim)))
        assert get_binary_path_from_package("torch_memory_saver_hook_mode_preload") == shim
        with _tms_env.configure_subprocess():
            assert os.environ["LD_PRELOAD"].split(":")[0] == shim
            child = run_child({}, cwd=tmp_path)
    finally:
        os.chdir(HERE)
    assert child["shim"] and child["origin"] == "process", child


@pytest.mark.parametrize("entry", ["spaced", "relative"])
def test_a_process_whose_ld_preload_named_the_shim_but_lacks_it_fails_at_first_use(
    shim, tmp_path, entry
):
    if entry == "spaced":
        copy = tmp_path / "a b" / "libtagmem_preload.so"
        copy.parent.mkdir()
        shutil.copyfile(shim, copy)
        ld_preload = str(copy)
    else:
        ld_preload = "libtagmem_preload.so"  # not on the loader's search path from tmp_path
    child = run_child({"LD_PRELOAD": ld_preload}, cwd=tmp_path)
    assert not child["shim"]
    assert "did not load it" in child.get("error", ""), child


def test_a_process_that_sets_ld_preload_for_its_children_is_not_refused(shim, tmp_path):
    # Only the environment the loader read at start counts, not what the process set since: a
    # child started without the shim names it on LD_PRELOAD (for its own children) before its
    # first tagmem call, and loads libtagmem as it would have without that. A fresh process,
    # because this one has bound its library already, wherever it found it.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    code = f"import os; os.environ['LD_PRELOAD'] = {shim!r}\n" + textwrap.dedent(CHILD)
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert not child["shim"] and child["mapped"] == [], child
    assert "error" not in child and child["origin"] != "process", child


def test_a_copy_of_the_shim_already_on_ld_preload_is_not_loaded_twice(shim, preload_env, tmp_path):
    # slime puts the copy beside the torch_memory_saver package on LD_PRELOAD itself; the
    # package's lib/ copy added by configure_subprocess() would be a second shim.
    tms_copy = tmp_path / "tms_path" / _preload.TMS_PRELOAD_NAME
    tms_copy.parent.mkdir()
    shutil.copyfile(shim, tms_copy)
    other = loaded_libc()
    preload_env.setenv("LD_PRELOAD", f"{tms_copy}:{other}")
    with _tms_env.configure_subprocess():
        assert os.environ["LD_PRELOAD"] == f"{shim}:{other}"
        child = run_child({}, cwd=tmp_path)
    assert child["mapped"] == [os.path.realpath(shim)] and child["origin"] == "process", child
