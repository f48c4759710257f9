"""The engines' call shapes through tagmem's drop-ins, on a GPU, written from their public source:

- SGLang (torch_memory_saver, preload hook mode): a scheduler spawned inside
  configure_subprocess(); weights, KV pool and CUDA graph in their regions; released kv_cache,
  weights, cuda_graph; resumed cuda_graph, weights, kv_cache with the trainer's weights written in
  place between the last two (standins/sglang_release_order.py), with and without a CPU backup.
- slime's offloaded trainer (standins/slime_like_trainer.py): its own process under the preload
  library with TMS_INIT_ENABLE=1, TMS_INIT_ENABLE_CPU_BACKUP=1, NCCL_CUMEM_ENABLE=0; pause,
  get_cpu_backup(x, zero_copy=True) while paused, resume, the weight update inside disable().
- vLLM's sleep-mode backend (tagmem.compat.vllm.SleepBackend, registered with the backend factory
  of standins/vllm, shaped as vllm/device_allocator/sleep_mode_backend.py): its abstract methods
  and capability flags, levels 0, 1 and 2, wake_up(tags=["weights"]), a weight reload,
  wake_up(tags=["kv_cache"]).

Every check compares random data byte for byte. Needs PyTorch, a CUDA GPU and the preload shim
(TAGMEM_PRELOAD_LIBRARY or an installed package); the slime case also needs NCCL.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import tagmem.torch as tt
from gpu_support import SMALL, MiB, as_bytes, device_free_bytes, run_spawned_scheduler
from tagmem.compat import _tms_env
from tagmem.compat import torch_memory_saver as dropin

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "standins")
NBYTES = (64 if SMALL else 512) * MiB
NOISE = 8 * MiB


@pytest.fixture
def tms_switched_on(monkeypatch):
    """`import torch_memory_saver` gives tagmem's drop-in here and in spawned children; the
    standins and this directory importable there too."""
    if _tms_env.preload_library() is None:
        pytest.fail("libtagmem_preload.so not found: set TAGMEM_PRELOAD_LIBRARY")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [STANDINS, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.syspath_prepend(STANDINS)
    monkeypatch.setenv(_tms_env.ENABLE_VARIABLE, "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    dropin.install()
    yield
    dropin.uninstall()


@pytest.mark.parametrize("cpu_backup", [True, False])
def test_sglang_release_and_resume_order_with_a_weight_update_between_resumes(
    tms_switched_on, cpu_backup
):
    import sglang_release_order

    out, exitcode = run_spawned_scheduler(
        sglang_release_order.run, (NBYTES, 21, cpu_backup), dropin.configure_subprocess)
    assert "error" not in out, out.get("error")
    assert out["tagmem"] and out["mode"] == "preload"
    assert out["ld_preload"].split(":")[0] == _tms_env.preload_library()
    assert out["freed"] >= 2 * NBYTES - NOISE
    if cpu_backup:
        assert out["backup_equal"] and out["weights_back"]
    assert out["weights_updated"] and out["graph_reads_new_weights"] and out["kv_ok"]
    assert exitcode == 0


def test_slime_trainer_under_the_preload_library_with_tms_init_enable(tmp_path):
    shim = _tms_env.preload_library()
    if shim is None:
        pytest.fail("libtagmem_preload.so not found: set TAGMEM_PRELOAD_LIBRARY")
    env = dict(os.environ)
    env.pop("TAGMEM_LIBRARY", None)  # the shim is libtagmem in the child
    env.update({
        "LD_PRELOAD": shim,
        "TMS_INIT_ENABLE": "1",
        "TMS_INIT_ENABLE_CPU_BACKUP": "1",
        "NCCL_CUMEM_ENABLE": "0",
        _tms_env.ENABLE_VARIABLE: "1",
        "PYTHONPATH": os.pathsep.join([_tms_env.shim_path(), HERE] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    })
    done = subprocess.run(
        [sys.executable, os.path.join(STANDINS, "slime_like_trainer.py"), "5", str(NBYTES),
         str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["tagmem"]
    assert out["owners"] == ["default"]
    assert out["freed"] >= 2 * NBYTES - NOISE
    assert all(out["paused_views"]) and all(out["resumed"]) and all(out["active_backup"])
    assert out["bucket_owner"] is None and out["bucket_equal"]
    assert out["second_cycle"]


def test_vllm_sleep_mode_backend_levels_and_tagged_wake_ups(monkeypatch):
    monkeypatch.syspath_prepend(STANDINS)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    from tagmem.compat import vllm as tv
    from vllm.device_allocator import sleep_mode_backend as registry

    tv.install()
    assert tv.register()
    backend_cls = registry.SleepModeBackendFactory.get_backend_class("tagmem")
    assert backend_cls is tv.SleepBackend and issubclass(backend_cls, registry.SleepModeBackend)
    assert backend_cls.is_supported()
    assert [backend_cls.preserves_communicators(), backend_cls.preserves_compiled_artifacts(),
            backend_cls.preserves_graphs_with_communicators(),
            backend_cls.supports_durable_storage()] == [True, True, True, False]
    allocator = tv.CuMemAllocator.get_instance()
    g = torch.Generator(device="cuda").manual_seed(9)
    with allocator.use_memory_pool(tag="weights"):
        weights = torch.randn(NBYTES // 4, device="cuda", generator=g)
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.zeros(NBYTES // 4, device="cuda")
    backend = backend_cls()
    expected = as_bytes(weights).cpu().clone()

    backend.suspend(level=0)  # scheduling only: the memory stays
    assert (tt.state("weights"), tt.state("kv_cache")) == ("resident", "resident")
    backend.resume()
    for level in (1, 2):
        free = device_free_bytes()
        backend.suspend(level=level)
        assert backend.state() == "SUSPENDED"
        assert device_free_bytes() >= free + 2 * NBYTES - NOISE
        backend.resume(tags=["weights"])
        assert tt.state("kv_cache") == "offloaded_discard"
        if level == 1:
            assert torch.equal(as_bytes(weights).cpu(), expected)
        new = torch.randn(weights.shape, generator=torch.Generator().manual_seed(level))
        weights.copy_(new.cuda())  # reload_weights: the new bytes in place
        expected = as_bytes(new).clone()
        backend.resume(tags=["kv_cache"])
        assert backend.state() == "RUNNING"
        kv.fill_(level)
        torch.cuda.synchronize()
        assert torch.equal(as_bytes(weights).cpu(), expected) and bool(torch.all(kv == level))
