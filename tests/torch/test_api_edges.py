"""Edges of the plain tag API: values ctypes would convert silently, tag names that collide with
the totals' names in the statistics, and a library that lacks a symbol.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import pytest

import tagmem


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
