"""The vLLM drop-in's sleep and discard semantics on the plain tag API, without PyTorch: its
allocator in tagmem.compat.vllm over tagmem.tag on the emulated device.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import types

import pytest

import tagmem
from tagmem.compat import vllm


@pytest.fixture
def allocator(monkeypatch):
    """A fresh CuMemAllocator whose pools are tagmem.tag scopes on device 0."""
    fake = types.SimpleNamespace(
        tag=tagmem.tag, device_index=lambda device=None: 0, offload=tagmem.offload,
        reload=tagmem.reload, BACKUP=tagmem.BACKUP, DISCARD=tagmem.DISCARD,
    )
    monkeypatch.setattr(vllm, "_tt", lambda: fake)
    return vllm.CuMemAllocator()


def filled(allocator, io, rng, tag):
    nbytes = rng.randrange(1, 64) << 14
    with allocator.use_memory_pool(tag):
        p = tagmem.raw_alloc(nbytes)
    data = rng.randbytes(nbytes)
    io.write(p, data)
    return p, data


def test_discard_leaves_a_sleeping_tags_backup_for_wake_up(allocator, io, rng):
    # vLLM skips allocations already asleep: their backup stays, and discarding them needs no
    # free device memory.
    p, data = filled(allocator, io, rng, "weights")
    filled(allocator, io, rng, "kv_cache")
    allocator.sleep(offload_tags=("weights",))
    allocator.discard(["weights", "kv_cache"])
    assert tagmem.state("weights") == "offloaded_backup"
    allocator.wake_up(["weights"])
    assert io.read(p, len(data)) == data


def test_discard_drops_a_resident_tag(allocator, io, rng):
    filled(allocator, io, rng, "kv_cache")
    allocator.discard("kv_cache")
    assert tagmem.state("kv_cache") == "offloaded_discard"
