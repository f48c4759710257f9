"""libtagmem_torch_alloc.so without PyTorch: the functions PyTorch would call, called via ctypes.

Slots must put memory in their bound tag whatever thread calls them (Note [torch allocator
slots]); the global entry point follows the calling thread's scope; failures are reported, never
crash. Runs on the emulated driver in CI and on the real driver in gpu_run.sh. The global entry
point's failure path throws a C++ exception, which ctypes cannot catch: entry_points_test.cpp
covers it.
"""

import ctypes
import threading

import pytest

import tagmem
from tagmem import _entry_points as ep

MiB = 1 << 20


def slot_alloc(tag):
    fn = getattr(ep.handle(), ep.slot_function(ep.slot_for(tag)))
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return lambda size, device=0, stream=None: fn(size, device, stream)


def global_alloc(size, device=0, stream=None):
    fn = ep.handle().tagmem_torch_alloc
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return fn(size, device, stream)


def entry_free(ptr, size=0, device=0, stream=None):
    fn = ep.handle().tagmem_torch_free
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    fn(ptr, size, device, stream)


def test_slot_allocations_land_in_the_bound_tag_from_any_thread(io, rng):
    alloc = slot_alloc("ep_weights")
    results = {}

    def worker(i):
        with tagmem.tag(f"thread_scope_{i}"):  # a thread scope must not matter for a slot
            results[i] = alloc(3 * MiB + i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results["main"] = alloc(100)
    for key, p in results.items():
        assert p, key
        assert tagmem.pointer_info(p)["tag"] == "ep_weights"
    assert tagmem.stats("thread_scope_0")["live_allocations"] == 0  # the scope's tag got nothing

    data = {p: rng.randbytes(100) for p in results.values()}
    for p, d in data.items():
        io.write(p, d)
    tagmem.offload("ep_weights")
    tagmem.reload("ep_weights")
    for p, d in data.items():
        assert io.read(p, 100) == d
    for p in results.values():
        entry_free(p)
    assert tagmem.stats("ep_weights")["live_allocations"] == 0


def test_slot_binding_is_permanent_and_checked():
    k = ep.slot_for("ep_bound")
    assert ep.slot_for("ep_bound") == k
    h = ep.handle()
    assert h.tagmem_torch_slot_tag(k) == b"ep_bound"
    assert h.tagmem_torch_bind_slot(k, b"ep_bound") == 0
    assert h.tagmem_torch_bind_slot(k, b"ep_other") == 1  # TAGMEM_ERROR_INVALID_ARGUMENT
    assert b"bound to tag 'ep_bound'" in h.tagmem_torch_bind_error()
    assert h.tagmem_torch_bind_slot(h.tagmem_torch_slot_count(), b"x") != 0
    assert b"out of range" in h.tagmem_torch_bind_error()
    assert h.tagmem_torch_slot_tag(-1) is None
    with pytest.raises(tagmem.InvalidArgumentError, match="printable"):
        ep.slot_for("has space")


def test_slot_allocation_in_an_offloaded_tag_returns_null_with_the_reason():
    alloc = slot_alloc("ep_off")
    assert alloc(MiB)
    tagmem.offload("ep_off")
    failures = ep.failures()
    assert alloc(MiB) is None
    assert ep.failures() == failures + 1
    reason = ep.last_failure()
    assert "TAGMEM_ERROR_TAG_OFFLOADED" in reason and "ep_off" in reason


def test_zero_size_gives_null_without_a_failure_and_null_free_is_ignored():
    failures = ep.failures()
    assert slot_alloc("ep_zero")(0) is None
    assert global_alloc(0) is None
    entry_free(None)
    assert ep.failures() == failures


def test_global_entry_point_follows_the_thread_scope():
    with tagmem.tag("ep_scope"):
        a = global_alloc(4096)
    b = global_alloc(4096)
    assert tagmem.pointer_info(a)["tag"] == "ep_scope"
    assert tagmem.pointer_info(b)["tag"] == "default"
    entry_free(a)
    entry_free(b)
    assert tagmem.stats("ep_scope")["live_allocations"] == 0


def test_a_bad_free_is_reported_not_fatal(capfd):
    p = global_alloc(4096)
    entry_free(p)
    failures = ep.failures()
    entry_free(p)  # double free
    assert ep.failures() == failures + 1
    assert "TAGMEM_ERROR_UNKNOWN_POINTER" in ep.last_failure()
    assert "TAGMEM_ERROR_UNKNOWN_POINTER" in capfd.readouterr().err
