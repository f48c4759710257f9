"""Edges of the plain tag API: values ctypes would convert silently, tag names that collide with
the totals' names in the statistics, and a library that lacks a symbol.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import os
import subprocess
import sys

import pytest

import tagmem
from conftest import loaded_libc


@pytest.mark.parametrize("bad", [1 << 64, -1, 1.9, True, "4096"])
def test_a_memory_margin_ctypes_would_convert_is_refused_and_changes_nothing(bad, rng):
    kept = rng.randrange(1, 1 << 40)
    tagmem.set_memory_margin(kept)
    try:
        with pytest.raises(tagmem.InvalidArgumentError, match="memory margin"):
            tagmem.set_memory_margin(bad)
        assert tagmem.memory_margin() == kept
    finally:
        tagmem.set_memory_margin(0)


def test_a_tag_named_all_keeps_its_own_statistics_beside_the_totals(rng):
    sizes = {}
    for name in ("all", "[all]", "other"):
        sizes[name] = rng.randrange(1, 64) << 16
        tagmem.raw_alloc(sizes[name], tag=name)
    out = tagmem.stats()
    for name, key in (("all", "[all]"), ("[all]", "[[all]]"), ("other", "other")):
        assert out[f"requested_bytes.{key}.current"] == sizes[name]
        assert out["by_tag"][name]["requested_bytes"] == sizes[name]
    assert out["requested_bytes.all.current"] == sum(sizes.values())


def test_a_library_without_tagmems_symbols_is_library_not_found():
    # TAGMEM_LIBRARY naming another library (here libc): an error that says which symbols are
    # missing, from the API and from `python -m tagmem config` alike, never an AttributeError.
    env = dict(os.environ, TAGMEM_LIBRARY=loaded_libc(), PYTHONPATH=os.pathsep.join(sys.path))
    code = ("import tagmem\ntry:\n    tagmem.tags()\nexcept tagmem.LibraryNotFound as e:\n"
            "    print('LibraryNotFound', e)")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("LibraryNotFound") and "lacks tagmem_" in run.stdout
    cli = subprocess.run([sys.executable, "-m", "tagmem", "config"], env=env, capture_output=True,
                         text=True)
    assert "Traceback" not in cli.stderr and "lacks tagmem_" in cli.stdout + cli.stderr, cli
