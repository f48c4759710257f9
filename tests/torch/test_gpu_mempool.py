"""MemPool mode on a GPU: tensors in tags keep their addresses and values across offload/reload.

Needs PyTorch and a CUDA GPU (gpu_run.sh). Every test uses its own tag names: tags outlive tests
here, because PyTorch keeps segments in them (conftest does not shut tagmem down for these files).
"""

import threading

import pytest
import torch

import tagmem
import tagmem.torch as tt
from gpu_support import MiB, SMALL, as_bytes, assert_unchanged, device_free_bytes, snapshot

# On a GPU the driver's own small allocations move free memory by a few MiB.
NOISE = 4 * MiB


def owner(t):
    """The tag holding tensor `t`, or None when tagmem did not allocate its memory."""
    try:
        return tagmem.pointer_info(t.data_ptr())["tag"]
    except tagmem.UnknownPointerError:
        return None


def test_views_slices_strided_and_offset_views_survive_backup():
    torch.manual_seed(0)
    with tt.tag("mp_views") as pool:
        assert isinstance(pool, torch.cuda.MemPool)
        flat = torch.randn(1 << 22, device="cuda")  # 16 MiB flat buffer
        matrix = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
        small = torch.randint(0, 1 << 30, (1000,), device="cuda", dtype=torch.int64)
    views = [
        flat[12345:12345 + 40000].view(200, 200),  # nonzero storage offset, reshaped
        flat[1::3],  # strided slice
        flat.as_strided((64, 64), (1, 64), storage_offset=777),  # transposed-like strides
        flat.as_strided((100, 100), (10, 1), storage_offset=4321),  # overlapping rows
        matrix.t(),
        matrix[100:200, ::2],
        small[10:],
    ]
    assert all(v.storage_offset() != 0 for v in (views[0], views[1], views[2], views[3], views[5], views[6]))
    tensors = [flat, matrix, small] + views
    assert {owner(t) for t in tensors} == {"mp_views"}
    before = snapshot(tensors)

    free_before = device_free_bytes()
    mapped = tt.stats("mp_views")["mapped_bytes"]
    tt.offload("mp_views")
    assert tt.state("mp_views") == "offloaded_backup"
    assert device_free_bytes() >= free_before + mapped - NOISE
    tt.reload("mp_views")
    assert_unchanged(tensors, before)

    flat.mul_(2)  # the memory is live again: writes land in the views too
    assert torch.equal(views[0].cpu(), (before[0][1][12345:52345] * 2).view(200, 200))
    tt.empty_cache("mp_views")


def test_offload_waits_for_queued_work_on_other_streams():
    n = 2048 if SMALL else 8192
    with tt.tag("mp_streams"):
        a = torch.randn(n, n, device="cuda")
        out = torch.empty(n, n, device="cuda")
    reference = torch.empty(n, n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.matmul(a, a, out=reference)
        for _ in range(4):  # still running when offload is called
            torch.matmul(a, a, out=out)
    tt.offload("mp_streams")  # no synchronisation by the caller: tagmem waits for the device
    tt.reload("mp_streams")
    torch.cuda.synchronize()
    assert torch.equal(out, reference)
    del a, out, reference
    tt.empty_cache("mp_streams")


def test_discard_releases_memory_and_keeps_addresses():
    with tt.tag("mp_discard"):
        kv = torch.ones(64 * MiB // 4, device="cuda")
    ptr = kv.data_ptr()
    free_before = device_free_bytes()
    tt.offload("mp_discard", mode="discard")
    assert tt.stats("mp_discard")["host_bytes"] == 0
    tt.wait_released()  # DISCARD hands the memory back on a background thread
    assert tt.stats()["release_pending_bytes"] == 0
    assert device_free_bytes() >= free_before + 64 * MiB - NOISE
    tt.reload("mp_discard")
    kv.fill_(3.0)
    assert kv.data_ptr() == ptr and torch.all(kv == 3.0)
    del kv
    tt.empty_cache("mp_discard")


def test_allocating_in_an_offloaded_tag_raises_before_touching_memory():
    with tt.tag("mp_guard"):
        t = torch.zeros(1000, device="cuda")
    tt.offload("mp_guard")
    with pytest.raises(tagmem.TagOffloadedError, match="mp_guard"):
        with tt.tag("mp_guard"):
            pass
    tt.reload("mp_guard")
    with tt.tag("mp_guard"):
        u = torch.ones(1000, device="cuda")
    assert owner(u) == "mp_guard" and torch.all(t == 0)


def test_gradients_reach_a_tag_only_with_all_threads():
    torch.manual_seed(0)
    with tt.tag("mp_params"):
        layer = torch.nn.Linear(256, 256, device="cuda")
    x = torch.randn(32, 256, device="cuda")
    with tt.tag("mp_grads_thread"):  # autograd's device thread does not see this scope
        layer(x).sum().backward()
    assert owner(layer.weight.grad) != "mp_grads_thread"
    layer.zero_grad(set_to_none=True)
    with tt.tag("mp_grads_all", all_threads=True):
        layer(x).sum().backward()
    assert owner(layer.weight.grad) == "mp_grads_all" and owner(layer.bias.grad) == "mp_grads_all"
    assert owner(layer.weight) == "mp_params"


def test_tensors_created_by_other_threads_inside_all_threads_land_in_the_tag():
    made = {}

    def worker():
        made["t"] = torch.ones(1000, device="cuda")

    with tt.tag("mp_threads", all_threads=True):
        th = threading.Thread(target=worker)
        th.start()
        th.join()
    assert owner(made["t"]) == "mp_threads"


def test_reload_out_of_memory_raises_keeps_the_tag_offloaded_and_succeeds_later():
    size = (256 if SMALL else 2048) * MiB
    torch.manual_seed(1)
    with tt.tag("mp_oom"):
        w = torch.randn(size // 4, device="cuda")
    before = snapshot([w])
    tt.offload("mp_oom")
    hog = torch.empty(device_free_bytes() - size // 2, dtype=torch.uint8, device="cuda")
    with pytest.raises(tagmem.OutOfMemoryError) as caught:
        tt.reload("mp_oom")
    assert isinstance(caught.value, MemoryError) and "TAGMEM_ERROR_OUT_OF_MEMORY" in str(caught.value)
    assert tt.state("mp_oom") == "offloaded_backup"
    assert tt.stats("mp_oom")["host_bytes"] >= size
    del hog
    torch.cuda.empty_cache()
    tt.reload("mp_oom")
    assert_unchanged([w], before)
    del w
    tt.empty_cache("mp_oom")


def test_empty_cache_returns_pytorch_cached_segments_of_a_tag():
    with tt.tag("mp_cache"):
        t = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del t  # PyTorch keeps the segment cached in the tag's pool
    assert tt.stats("mp_cache")["mapped_bytes"] >= 256 * MiB
    reserved = torch.cuda.memory_reserved()
    tt.empty_cache("mp_cache")
    assert tt.stats("mp_cache")["mapped_bytes"] == 0
    assert torch.cuda.memory_reserved() <= reserved - 256 * MiB
    with tt.tag("mp_cache"):  # a fresh pool serves the tag afterwards
        u = torch.zeros(10, device="cuda")
    assert owner(u) == "mp_cache"


def test_stats_bridging_memory_reserved_keeps_counting_an_offloaded_tag():
    # Documented in docs/torch.md: PyTorch does not know that tagmem unmapped its segments.
    with tt.tag("mp_stats"):
        t = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
    reserved = torch.cuda.memory_reserved()
    allocated = torch.cuda.memory_allocated()
    free_before = device_free_bytes()
    tt.offload("mp_stats", mode="discard")
    tt.wait_released()
    assert torch.cuda.memory_reserved() == reserved
    assert torch.cuda.memory_allocated() == allocated
    assert device_free_bytes() >= free_before + 128 * MiB - NOISE
    s = tt.stats()
    assert s["by_tag"]["mp_stats"]["state"] == "offloaded_discard"
    assert s["by_tag"]["mp_stats"]["mapped_bytes"] == 0
    assert s["torch_reserved_bytes"] == reserved
    tt.reload("mp_stats")
    assert torch.cuda.memory_reserved() == reserved
    del t
    tt.empty_cache("mp_stats")


def test_swap_and_resident_switch_phases_with_values_intact():
    torch.manual_seed(2)
    with tt.tag("mp_trainer"):
        a = torch.randn(1 << 20, device="cuda")
    with tt.tag("mp_rollout"):
        b = torch.randn(1 << 20, device="cuda", dtype=torch.float16)
    before = snapshot([a, b])
    tt.offload("mp_rollout")
    tt.swap("mp_trainer", "mp_rollout")
    assert torch.equal(as_bytes(b.cpu()), as_bytes(before[1][1]))
    with tt.resident("mp_trainer"):
        assert tt.state("mp_trainer") == "resident"
        a.add_(1)
    assert tt.state("mp_trainer") == "offloaded_backup"
    tt.reload("mp_trainer")
    assert torch.equal(a.cpu(), before[0][1] + 1)


def test_nested_tags_route_to_the_innermost():
    with tt.tag("mp_outer"):
        a = torch.empty(1000, device="cuda")
        with tt.tag("mp_inner"):
            b = torch.empty(1000, device="cuda")
        c = torch.empty(1000, device="cuda")
    d = torch.empty(1000, device="cuda")
    assert [owner(t) for t in (a, b, c, d)] == ["mp_outer", "mp_inner", "mp_outer", None]


def test_replicated_tag_of_one_round_trips_through_its_shared_copy(monkeypatch):
    """tagmem.torch.set_replicated: a group of one writes the whole tag to its shared host copy
    (docs/replicated.md; the multi-process cases are in test_api.py and the handoff tests)."""
    monkeypatch.setenv("TAGMEM_JOB", "py-gpu-replica-one")
    torch.manual_seed(3)
    with tt.tag("mp_replica"):
        x = torch.randn(3 << 20, device="cuda")
    before = snapshot([x])
    mapped = tt.stats("mp_replica")["mapped_bytes"]
    tt.set_replicated("mp_replica", "one", rank=0, size=1)
    tt.offload("mp_replica")
    s = tt.stats("mp_replica")
    assert s["state"] == "offloaded_backup"
    assert s["bytes_offloaded"] == mapped  # a group of one copies every share itself
    assert s["host_bytes"] > mapped  # the shared copy and its header page
    tt.reload("mp_replica")
    assert_unchanged([x], before)
    assert tt.stats("mp_replica")["host_bytes"] == 0
    tt.set_replicated("mp_replica", None)
