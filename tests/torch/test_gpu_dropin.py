"""The drop-ins as engines use them, on a GPU: torch_memory_saver in torch hook mode in this
process and in preload hook mode in an SGLang-shaped scheduler spawned through
configure_subprocess(); vLLM's allocator module replaced for a vLLM-shaped worker; offloaded
bytes read on the host as CPU tensors.

Needs PyTorch, a CUDA GPU and TAGMEM_PRELOAD_LIBRARY or an installed package with the shim
(gpu_run.sh provides both).
"""

import os
import sys

import pytest
import torch

import tagmem
import tagmem.torch as tt
from gpu_support import (
    SMALL,
    MiB,
    as_bytes,
    assert_unchanged,
    device_free_bytes,
    run_spawned_scheduler,
    snapshot,
)
from tagmem.compat import _tms_env
from tagmem.compat import torch_memory_saver as dropin

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "standins")
NBYTES = (64 if SMALL else 1024) * MiB
NOISE = 8 * MiB


def test_host_tensor_reads_an_offloaded_tensor_and_a_view_writes_what_reload_restores():
    g = torch.Generator(device="cuda").manual_seed(11)
    with tt.tag("ht"):
        a = torch.randn(NBYTES // 8, device="cuda", generator=g)
        b = torch.randint(0, 1 << 30, (1000, 3), device="cuda", generator=g)
    before = snapshot([a, b])
    tt.offload("ht")
    copy = tt.host_tensor(a)
    assert copy.device.type == "cpu" and copy.dtype == a.dtype and copy.shape == a.shape
    assert torch.equal(as_bytes(copy), as_bytes(before[0][1]))
    view = tt.host_tensor(b, copy=False)
    assert torch.equal(view, before[1][1])
    view.add_(1)  # written in the pinned backup itself
    tt.reload("ht")
    assert torch.equal(b.cpu(), before[1][1] + 1)
    assert_unchanged([a], before[:1])
    with pytest.raises(tagmem.TagResidentError):
        tt.host_tensor(a)


def test_retained_cpu_backup_outlives_resume_and_each_pause_refreshes_it():
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    assert saver.retain_cpu_backup is False
    g = torch.Generator(device="cuda").manual_seed(13)
    with saver.region(tag="rt_w", enable_cpu_backup=True):
        w = torch.randint(0, 256, (4 * MiB + 77,), dtype=torch.uint8, device="cuda", generator=g)
    first = w.cpu()
    saver.pause("rt_w")
    saver.retain_cpu_backup = True
    saver.resume("rt_w")
    kept = saver.get_cpu_backup(w, zero_copy=True)
    assert kept is not None and torch.equal(kept, first)
    w.copy_(torch.randint(0, 256, w.shape, dtype=torch.uint8, device="cuda", generator=g))
    second = w.cpu()
    assert not torch.equal(second, first)
    assert torch.equal(saver.get_cpu_backup(w), first)  # the snapshot of the last pause
    del kept
    saver.retain_cpu_backup = False  # gives nothing back by itself
    assert torch.equal(saver.get_cpu_backup(w), first)
    saver.pause("rt_w")  # writes a fresh copy
    assert torch.equal(saver.get_cpu_backup(w, zero_copy=True), second)
    saver.resume("rt_w")  # without retention: the copy is given back
    assert saver.get_cpu_backup(w) is None
    assert torch.equal(w.cpu(), second)
    assert tt.stats("rt_w")["host_bytes"] == 0


def test_torch_mode_backup_disable_margin_and_a_resume_that_does_not_fit():
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    g = torch.Generator(device="cuda").manual_seed(12)
    with saver.region(tag="tm_w", enable_cpu_backup=True):
        w = torch.randn(NBYTES // 4, device="cuda", generator=g)
    with saver.region(tag="tm_kv"):
        kv = torch.zeros(NBYTES // 4, device="cuda")
    with saver.disable():
        plain = torch.ones(MiB, device="cuda")
    with pytest.raises(tagmem.UnknownPointerError):
        tagmem.pointer_info(plain.data_ptr())
    before = snapshot([w])
    assert saver.get_cpu_backup(w) is None
    saver.pause("tm_w")
    saver.pause("tm_kv")
    assert torch.equal(as_bytes(saver.get_cpu_backup(w)), as_bytes(before[0][1]))
    with pytest.raises(tagmem.TagOffloadedError):
        saver.get_cpu_backup(kv)
    # Fill the device so the weights cannot come back, then retry once there is room.
    blocker = torch.empty(device_free_bytes() - NBYTES // 2, dtype=torch.uint8, device="cuda")
    with pytest.raises(MemoryError):
        saver.resume("tm_w")
    assert tt.state("tm_w") == "offloaded_backup"
    del blocker
    torch.cuda.empty_cache()
    saver.resume("tm_w")
    assert_unchanged([w], before)
    saver.resume("tm_kv")
    saver.memory_margin_bytes = device_free_bytes() - 32 * MiB
    try:
        with pytest.raises(torch.OutOfMemoryError):
            with saver.region(tag="tm_margin"):
                torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    finally:
        saver.memory_margin_bytes = 0


def test_sglang_like_scheduler_in_preload_mode_through_configure_subprocess(monkeypatch):
    if _tms_env.preload_library() is None:
        pytest.fail("libtagmem_preload.so not found: set TAGMEM_PRELOAD_LIBRARY")
    monkeypatch.setenv("PYTHONPATH", f"{STANDINS}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(STANDINS)
    monkeypatch.setenv(_tms_env.ENABLE_VARIABLE, "1")  # both restored after the test
    monkeypatch.setattr(sys, "path", list(sys.path))
    dropin.install()
    import sglang_like_scheduler

    out, exitcode = run_spawned_scheduler(
        sglang_like_scheduler.run, (NBYTES, 13), dropin.configure_subprocess)
    assert "error" not in out, out.get("error")
    assert out["tagmem"] and out["mode"] == "preload"
    assert out["ld_preload"].split(":")[0] == _tms_env.preload_library()
    assert out["owners"] == ["weights", "kv_cache", None, None, "cuda_graph"]
    assert out["freed"] >= 2 * NBYTES - NOISE
    assert out["backup_equal"] and out["view_equal"] and out["weights_equal"]
    assert out["active_backup"] and out["graph_equal"] and out["kv_ok"]
    assert out["pause_twice"] == "raised" and out["resume_active"] == "raised"
    assert exitcode == 0


def test_vllm_like_worker_imports_tagmem_allocator_and_sleeps_by_level(monkeypatch):
    monkeypatch.syspath_prepend(STANDINS)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    from tagmem.compat import vllm as tv

    tv.install()
    import vllm_like_worker

    worker = vllm_like_worker.Worker(NBYTES, NBYTES)
    assert tagmem.pointer_info(worker.weights.data_ptr())["tag"] == "weights"
    before = snapshot([worker.weights])
    free = device_free_bytes()
    worker.sleep(level=1)
    assert device_free_bytes() >= free + 2 * NBYTES - NOISE
    assert (tt.state("weights"), tt.state("kv_cache")) == ("offloaded_backup", "offloaded_discard")
    worker.wake_up(["weights"])  # verl / OpenRLHF: weights, update, then the KV cache
    assert_unchanged([worker.weights], before)
    worker.weights.add_(1)
    updated = snapshot([worker.weights])
    worker.wake_up(["kv_cache"])
    worker.kv_cache.fill_(5)
    worker.sleep(level=2)
    assert (tt.state("weights"), tt.state("kv_cache")) == ("offloaded_discard", "offloaded_discard")
    worker.wake_up()
    worker.weights.copy_(updated[0][1].cuda())  # level 2: the trainer sends the weights again
    assert_unchanged([worker.weights], updated)
    worker.sleep(level=1)
    allocator = tv.CuMemAllocator.get_instance()
    # vLLM's discard() skips allocations that are asleep already: the weights keep the CPU
    # backup level 1 made, and the wake-up restores it; the KV cache has nothing to keep.
    allocator.discard(("weights", "kv_cache"))
    assert (tt.state("weights"), tt.state("kv_cache")) == ("offloaded_backup", "offloaded_discard")
    worker.wake_up()
    assert_unchanged([worker.weights], updated)
    allocator.discard(("kv_cache",))  # a resident tag: its bytes are dropped
    assert (tt.state("weights"), tt.state("kv_cache")) == ("resident", "offloaded_discard")
    worker.wake_up()
