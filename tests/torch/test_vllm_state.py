"""The vLLM drop-in's sleep and discard semantics on the plain tag API, without PyTorch: its
allocator in tagmem.compat.vllm over tagmem.tag on the emulated device.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import json
import os
import subprocess
import sys
import textwrap
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


def test_sleep_leaves_the_copies_running_when_offloads_return_early(
    allocator, io, rng, monkeypatch
):
    # TAGMEM_OFFLOAD_RETURN=queued (read when tagmem starts, here at the first allocation): sleep
    # returns with the offload's copies queued instead of waiting in wait_released; wake_up waits
    # for the offload's end and gets every byte back.
    monkeypatch.setenv("TAGMEM_OFFLOAD_RETURN", "queued")
    waited = []
    real = vllm._api.wait_released
    monkeypatch.setattr(vllm._api, "wait_released", lambda d=None: (waited.append(d), real(d)))
    p, data = filled(allocator, io, rng, "weights")
    allocator.sleep(offload_tags=("weights",))
    assert waited == []
    allocator.wake_up(["weights"])
    assert io.read(p, len(data)) == data


def test_sleep_drops_the_kv_cache_before_it_copies_the_weights(allocator, io, rng):
    # Each offload first waits for the device, and with early return that includes the copies
    # of the offload before it (Note [drop before copying]): the kv cache goes first, so that
    # its memory is free at once. Then the weights come back whole.
    calls = []
    fake = vllm._tt()
    real = fake.offload
    fake.offload = lambda tags, mode, d=None: (
        calls.append((list(tags), mode)), real(tags, mode, d))[1]
    p, data = filled(allocator, io, rng, "weights")
    filled(allocator, io, rng, "kv_cache")
    allocator.sleep(offload_tags=("weights",))
    assert calls == [(["kv_cache"], tagmem.DISCARD), (["weights"], tagmem.BACKUP)]
    allocator.wake_up()
    assert io.read(p, len(data)) == data


@pytest.mark.parametrize("release", ["1", "0"])
def test_the_sleep_backend_gives_pinned_host_memory_back_when_vllm_asks(
    allocator, io, rng, monkeypatch, release
):
    # vLLM's VLLM_SLEEP_MODE_RELEASE_HOST_MEMORY=1: after wake-up the backups' pinned host
    # memory goes back to the OS instead of staying cached for the next sleep.
    monkeypatch.setattr(vllm.CuMemAllocator, "instance", allocator)
    monkeypatch.setenv("VLLM_SLEEP_MODE_RELEASE_HOST_MEMORY", release)
    p, data = filled(allocator, io, rng, vllm.WEIGHTS)
    backend = vllm.SleepBackend()
    backend.suspend(level=1)
    assert tagmem.stats()["host_pinned_bytes"] >= len(data)
    backend.resume()
    assert io.read(p, len(data)) == data and backend.state() == "RUNNING"
    pinned = tagmem.stats()["host_pinned_bytes"]
    assert pinned == 0 if release == "1" else pinned >= len(data)


def test_the_sleep_backend_runs_levels_0_1_2_and_a_weight_reload_between_wake_ups(
    allocator, io, rng, monkeypatch
):
    # vLLM's sleep-mode backend as verl and OpenRLHF drive it: suspend(level), then
    # resume(["weights"]), the weights reloaded in place, then resume(["kv_cache"]).
    monkeypatch.setattr(vllm.CuMemAllocator, "instance", allocator)
    w, data = filled(allocator, io, rng, vllm.WEIGHTS)
    kv, _ = filled(allocator, io, rng, vllm.KV_CACHE)
    backend = vllm.SleepBackend()
    flags = [backend.preserves_communicators(), backend.preserves_compiled_artifacts(),
             backend.preserves_graphs_with_communicators(), backend.supports_durable_storage()]
    assert flags == [True, True, True, False]
    backend.suspend(level=0)  # scheduling paused only: nothing leaves the device
    assert backend.state() == "SUSPENDED"
    assert [tagmem.state(t) for t in (vllm.WEIGHTS, vllm.KV_CACHE)] == ["resident"] * 2
    backend.resume()
    assert backend.state() == "RUNNING"
    for level, weights_state in ((1, "offloaded_backup"), (2, "offloaded_discard")):
        backend.suspend(level=level)
        assert [tagmem.state(t) for t in (vllm.WEIGHTS, vllm.KV_CACHE)] == [
            weights_state, "offloaded_discard"]
        backend.resume(tags=[vllm.WEIGHTS])
        assert tagmem.state(vllm.KV_CACHE) == "offloaded_discard"
        if level == 1:
            assert io.read(w, len(data)) == data
        data = rng.randbytes(len(data))  # the trainer's new weights, loaded in place
        io.write(w, data)
        backend.resume(tags=[vllm.KV_CACHE])
        assert backend.state() == "RUNNING" and tagmem.state(vllm.KV_CACHE) == "resident"
        assert io.read(w, len(data)) == data
        io.write(kv, data[:4096])  # the KV cache is writable again
    with pytest.raises(tagmem.InvalidArgumentError):
        backend.suspend(level=3)


def run_with_standin_vllm(code):
    standins = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([standins] + [p for p in sys.path if p]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_install_after_a_vllm_module_bound_the_allocator_by_name_rebinds_it():
    # vLLM's vllm/v1/worker/gpu_worker.py does `from vllm.device_allocator.cumem import
    # CuMemAllocator` at import; install() afterwards must reach that binding too.
    child = run_with_standin_vllm(
        """
        import json, sys, types
        import vllm.device_allocator as parent
        class vllms:  # vLLM's class, in vLLM's module
            instance = None
        theirs = types.ModuleType("vllm.device_allocator.cumem")
        theirs.CuMemAllocator = vllms
        sys.modules[theirs.__name__] = parent.cumem = theirs
        worker = types.ModuleType("vllm.gpu_worker_like")
        worker.CuMemAllocator = vllms
        sys.modules[worker.__name__] = worker
        import tagmem.compat.vllm as tv
        tv.install()
        out = {"rebound": worker.CuMemAllocator is tv.CuMemAllocator}
        vllms.instance = object()  # vLLM's allocator has handed out memory: refused
        sys.modules[theirs.__name__] = parent.cumem = theirs
        try:
            tv.install()
        except RuntimeError as e:
            out["refused"] = "before vLLM builds its workers" in str(e)
        print(json.dumps(out))
        """
    )
    assert child == {"rebound": True, "refused": True}


def test_use_memory_pool_switches_expandable_segments_off_around_the_pool(allocator, monkeypatch):
    # vLLM's CuMemAllocator.use_memory_pool does the same when PYTORCH_CUDA_ALLOC_CONF has
    # expandable_segments:True: PyTorch would otherwise map the pool's memory itself.
    settings = []
    memory = types.SimpleNamespace(_set_allocator_settings=settings.append)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
        cuda=types.SimpleNamespace(memory=memory)))
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF",
                       "garbage_collection_threshold:0.6,expandable_segments:True")
    with allocator.use_memory_pool("weights"):
        assert settings == ["expandable_segments:False"]
        tagmem.raw_alloc(4096)
    assert settings == ["expandable_segments:False", "expandable_segments:True"]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    with allocator.use_memory_pool("weights"):
        pass
    assert len(settings) == 2
