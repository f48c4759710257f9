"""tagmem._summary (what tagmem.torch.memory_stats / memory_summary show), torch-free.

The keys follow torch.cuda.memory_stats() with the tag in the pool's place; every value is
checked against the C ABI's tag statistics after allocations of random sizes, an offload and a
reload, and the peak stays at the high-water mark after frees.
"""

import tagmem
from tagmem import _summary

MiB = 1 << 20


def test_memory_stats_follow_torch_naming_and_track_peaks(rng):
    sizes = [rng.randrange(1, 8 * MiB) for _ in range(rng.randrange(3, 9))]
    ptrs = [tagmem.raw_alloc(n, tag="w") for n in sizes]
    small = tagmem.raw_alloc(rng.randrange(1, MiB), tag="s")
    peak_alloc = tagmem.stats("w")["allocated_bytes"]
    peak_mapped = tagmem.stats("w")["mapped_bytes"]
    for p in ptrs[: len(ptrs) // 2 + 1]:
        tagmem.raw_free(p)
    tagmem.offload(["w"])
    s = tagmem.stats("w")
    m = _summary.memory_stats()
    assert s["peak_allocated_bytes"] == peak_alloc > s["allocated_bytes"]
    assert m["allocated_bytes.w.current"] == s["allocated_bytes"]
    assert m["allocated_bytes.w.peak"] == peak_alloc
    assert m["mapped_bytes.w.current"] == 0
    assert m["mapped_bytes.w.peak"] == peak_mapped
    assert m["offloaded_bytes.w.current"] == s["reserved_bytes"]
    assert m["host_bytes.w.current"] == s["host_bytes"] > 0
    assert m["allocation.w.current"] == len(ptrs) - (len(ptrs) // 2 + 1)
    assert m["allocation.w.allocated"] == len(ptrs)
    assert m["allocation.w.freed"] == len(ptrs) // 2 + 1
    assert m["offload_count.w"] == 1
    ss = tagmem.stats("s")
    for metric in ("allocated_bytes", "reserved_bytes", "mapped_bytes", "host_bytes"):
        assert m[metric + ".all.current"] == s[metric] + ss[metric]
    everything = tagmem.stats()  # tagmem.torch.stats() is this on the current CUDA device
    assert {k: everything[k] for k in m} == m
    tagmem.reload(["w"])
    m = _summary.memory_stats()
    assert m["mapped_bytes.w.current"] == tagmem.stats("w")["mapped_bytes"] > 0
    assert m["reload_count.w"] == 1

    text = _summary.memory_summary(0)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == "|" + "=" * 75 + "|"
    assert all(len(line) == 77 for line in lines), [l for l in lines if len(l) != 77]
    assert any(line.startswith("| w ") and "resident" in line for line in lines)
    assert any(line.startswith("| s ") for line in lines)
    for p in ptrs[len(ptrs) // 2 + 1 :]:
        tagmem.raw_free(p)
    tagmem.raw_free(small)
