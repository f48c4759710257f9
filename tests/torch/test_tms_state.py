"""The torch_memory_saver drop-in's process state, without PyTorch: one implementation per saver
however many first calls race, and the record of which tags want a CPU backup shared by every
saver in the process (as torch_memory_saver keeps it with each allocation).

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
import types

import pytest

import tagmem
from tagmem import _preload
from tagmem.compat import torch_memory_saver as dropin


def test_racing_first_calls_make_one_implementation(monkeypatch):
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    made = []
    # Each construction waits for a second one: with the lock there never is one, and the wait
    # ends at the barrier's timeout (a bound on the test, not an assertion on time).
    barrier = threading.Barrier(2, timeout=2)
    real_init = dropin._Impl.__init__

    def init(self, *args, **kwargs):
        made.append(self)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(dropin._Impl, "__init__", init)
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(saver._ensure_initialized()))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and seen == [made[0], made[0]]


@pytest.fixture
def torch_free(monkeypatch):
    """The drop-in in torch hook mode over the plain tag API: a region is tagmem.tag, and the
    device is the emulated driver's one."""
    cuda = types.SimpleNamespace(
        device_count=lambda: 1, current_device=lambda: 0, synchronize=lambda device=None: None
    )
    monkeypatch.setattr(dropin, "_torch", lambda: types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(
        dropin,
        "_tt",
        lambda: types.SimpleNamespace(
            tag=lambda name, pool=None: tagmem.tag(name),
            pool=lambda name: name,
            new_pool=lambda name: name,
        ),
    )


def test_a_backup_any_saver_asked_for_is_kept_by_every_saver(torch_free, io, rng):
    tag = f"w{rng.randrange(1 << 30)}"
    first, second = dropin.TorchMemorySaver(), dropin.TorchMemorySaver()
    first.hook_mode = second.hook_mode = "torch"
    nbytes = rng.randrange(1, 64) << 14
    with first.region(tag=tag, enable_cpu_backup=True):
        p = tagmem.raw_alloc(nbytes)
    data = rng.randbytes(nbytes)
    io.write(p, data)
    with second.region(tag=tag):  # a later region without a backup changes nothing
        pass
    second.pause(tag)
    assert tagmem.state(tag) == "offloaded_backup"
    second.resume(tag)
    assert io.read(p, nbytes) == data


def test_tms_init_enable_pauses_the_tag_the_shim_routes_to(rng):
    # Under TMS_INIT_ENABLE=1 the shim puts every cudaMalloc into its default tag, which
    # TAGMEM_PRELOAD_TAG renames: pause() must know that tag, with the backup asked for.
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    tag = f"t{rng.randrange(1 << 30)}"
    code = """
        import ctypes, json, types
        import tagmem
        from tagmem.compat import torch_memory_saver as dropin
        cuda = types.SimpleNamespace(device_count=lambda: 1, synchronize=lambda device=None: None)
        dropin._torch = lambda: types.SimpleNamespace(cuda=cuda)
        cuda_malloc = ctypes.CDLL(None).cudaMalloc
        cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        p = ctypes.c_void_p()
        assert cuda_malloc(ctypes.byref(p), 3 << 20) == 0
        owner = tagmem.pointer_info(p.value)["tag"]
        saver = dropin.TorchMemorySaver()
        saver.pause()
        print(json.dumps({"owner": owner, "mode": saver._impl.hook_mode,
                          "state": tagmem.state(owner)}))
    """
    env = dict(os.environ, LD_PRELOAD=shim, TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1",
               TAGMEM_PRELOAD_TAG=tag)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child == {"owner": tag, "mode": "preload", "state": "offloaded_backup"}


def test_reading_hook_mode_initialises_nothing_and_configuration_closes_after_first_use():
    # torch_memory_saver's hook_mode getter raises AttributeError, and its _impl_ctor_kwargs is
    # deleted at first use; patches test hasattr(saver, "_impl_ctor_kwargs") before setting
    # hook_mode (so an import-time `hook_mode = "torch"` runs only while it may).
    saver = dropin.TorchMemorySaver()
    assert not hasattr(saver, "hook_mode") and saver._impl is None
    assert hasattr(saver, "_impl_ctor_kwargs")
    saver.hook_mode = "torch"
    saver._ensure_initialized()
    assert saver.hook_mode == "torch"
    assert not hasattr(saver, "_impl_ctor_kwargs")
    with pytest.raises(AttributeError, match="before first use"):
        saver.hook_mode = "torch"
    if hasattr(saver, "_impl_ctor_kwargs"):  # what such a patch does: nothing now
        saver.hook_mode = "preload"
    assert saver.hook_mode == "torch"


def test_capturing_a_graph_into_a_paused_tag_is_refused_before_the_capture(torch_free, monkeypatch):
    # A paused tag's MemPool still lists its cached blocks: the capture would get unmapped memory.
    entered = []
    cuda = dropin._torch().cuda
    cuda.current_device = lambda: 0
    cuda.graph = lambda *a, **k: entered.append(a) or contextlib.nullcontext()
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    with saver.region(tag="graph"):
        tagmem.raw_alloc(1 << 20)
    saver.pause("graph")
    with pytest.raises(tagmem.TagOffloadedError, match="resume"):
        with saver.cuda_graph(object(), pool=1, tag="graph"):
            pass
    assert entered == []
    saver.resume("graph")
    with saver.cuda_graph(object(), pool=1, tag="graph"):
        pass
    assert len(entered) == 1


def _mappings():
    """The address ranges this process maps (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            yield lo, hi


def test_torch_mode_mmap_backend_gives_host_memory_back_after_resume_and_answers_the_c_calls(
    torch_free, io, rng, monkeypatch
):
    # torch_memory_saver's cpu_backup examples in torch mode: cpu_backup_backend="mmap" per region
    # or TMS_INIT_CPU_BACKUP_BACKEND, read back through _impl._binary_wrapper.cdll, and its
    # promise that the process's host memory drops after a resume that keeps no copy.
    monkeypatch.setenv("TMS_INIT_CPU_BACKUP_BACKEND", "mmap")
    plans = {}
    real_plan = dropin._api.plan_offload

    def plan(tag, mode=tagmem.BACKUP, device=None):
        plans[tag] = mode
        real_plan(tag, mode, device)

    monkeypatch.setattr(dropin._api, "plan_offload", plan)
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    cdll = saver._ensure_initialized()._binary_wrapper.cdll
    assert cdll.tms_get_cpu_backup_backend() == b"mmap"
    pinned, mapped = (f"{k}{rng.randrange(1 << 30)}" for k in ("p", "m"))
    nbytes = rng.randrange(64, 128) << 16
    with saver.region(tag=pinned, enable_cpu_backup=True, cpu_backup_backend="pinned"):
        a = tagmem.raw_alloc(nbytes)
    with saver.region(tag=mapped, enable_cpu_backup=True):  # the backend from the environment
        b = tagmem.raw_alloc(nbytes)
    # Pinned ahead as it grows: only the "pinned" tag (an "mmap" backup holds host memory only
    # while its tag is paused).
    assert plans == {pinned: tagmem.BACKUP, mapped: tagmem.DISCARD}
    da, db = rng.randbytes(nbytes), rng.randbytes(nbytes)
    io.write(a, da)
    io.write(b, db)
    host = lambda: tagmem.stats()["host_pinned_bytes"]  # noqa: E731
    assert cdll.tms_pause(pinned.encode()) == 0 and cdll.tms_resume(pinned.encode()) == 0
    kept = host()
    assert kept >= nbytes  # the pinned backend keeps its host memory for the next pause
    assert cdll.tms_pause(mapped.encode()) == 0
    assert cdll.tms_pause(mapped.encode()) == 3  # paused already: TAG_OFFLOADED
    assert host() >= kept + nbytes  # host memory of its own
    view = cdll.tms_get_cpu_backup_pointer(b, nbytes)
    assert view and bytes(view[:nbytes]) == db
    address = ctypes.cast(view, ctypes.c_void_p).value
    saver.resume(mapped)
    # The "mmap" region's host memory has left the process; the "pinned" region's has not.
    assert host() == kept
    assert not any(lo <= address < hi for lo, hi in _mappings())
    assert not cdll.tms_get_cpu_backup_pointer(b, nbytes)
    assert cdll.tms_pause(pinned.encode()) == 0 and host() == kept  # no pinning for it
    assert cdll.tms_resume(pinned.encode()) == 0
    assert io.read(a, nbytes) == da and io.read(b, nbytes) == db
    with pytest.raises(ValueError, match="'pinned' or 'mmap'"):
        with saver.region(tag=pinned, enable_cpu_backup=True, cpu_backup_backend="floppy"):
            pass


def test_torch_mode_one_tag_with_and_without_a_backup_keeps_only_the_backed_up_bytes(
    torch_free, io, rng
):
    # torch_memory_saver's cpu_backup example: regions of one tag with and without a CPU backup
    # pause together, and only the backed-up allocations keep their bytes; the pools are found
    # under torch_memory_saver's key.
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    tag = f"t{rng.randrange(1 << 30)}"
    sizes = [rng.randrange(1, 64) << 12 for _ in range(3)]
    with saver.region(tag=tag, enable_cpu_backup=True, cpu_backup_backend="mmap"):
        a = tagmem.raw_alloc(sizes[0])
    with saver.region(tag=tag):
        b = tagmem.raw_alloc(sizes[1])
    with saver.region(tag=tag, enable_cpu_backup=True, cpu_backup_backend="pinned"):
        c = tagmem.raw_alloc(sizes[2])
    data = [rng.randbytes(n) for n in sizes]
    for ptr, d in zip((a, b, c), data):
        io.write(ptr, d)
    owners = [tagmem.pointer_info(x)["tag"] for x in (a, b, c)]
    assert owners == [tag, tag + "+no_backup", tag]
    assert set(saver._impl._mem_pools) == {
        (tag, True, False, "mmap", 0), (tag, False, False, "", 0), (tag, True, False, "pinned", 0)
    }
    saver.pause(tag)
    assert [tagmem.state(tag), tagmem.state(tag + "+no_backup")] == [
        "offloaded_backup", "offloaded_discard"
    ]
    with pytest.raises(tagmem.TagOffloadedError):
        saver.pause(tag)
    saver.resume(tag)
    with pytest.raises(tagmem.TagResidentError):
        saver.resume(tag)
    assert io.read(a, sizes[0]) == data[0] and io.read(c, sizes[2]) == data[2]
    io.write(b, data[1])  # given back without its bytes, writable again
    assert io.read(b, sizes[1]) == data[1]
    for ptr in (a, b, c):
        tagmem.raw_free(ptr)


def test_torch_mode_pause_of_every_tag_drops_before_it_copies(torch_free, io, rng, monkeypatch):
    # Each offload first waits for the device, and with early return that includes the copies
    # of the offload before it (Note [drop before copying]): pause() offloads the regions without
    # a backup before those with one, so that their memory is free at once. Then the bytes come
    # back whole.
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    tags = [f"w{rng.randrange(1 << 30)}", f"kv{rng.randrange(1 << 30)}"]
    with saver.region(tag=tags[0], enable_cpu_backup=True):
        w = tagmem.raw_alloc(rng.randrange(1, 64) << 12)
    with saver.region(tag=tags[1]):
        kv = tagmem.raw_alloc(rng.randrange(1, 64) << 12)
    nbytes = tagmem.pointer_info(w)["size"]
    data = rng.randbytes(nbytes)
    io.write(w, data)
    calls = []
    real = dropin._api.offload
    monkeypatch.setattr(
        dropin._api, "offload",
        lambda names, mode, d=None: (calls.append((sorted(names), mode)), real(names, mode, d))[1],
    )
    saver.pause()
    assert calls == [([tags[1]], tagmem.DISCARD), ([tags[0]], tagmem.BACKUP)]
    saver.resume()
    assert io.read(w, nbytes) == data
    for ptr in (w, kv):
        tagmem.raw_free(ptr)


def test_torch_mode_disk_backup_spills_to_files_and_restores_them(torch_free, io, rng, tmp_path):
    # torch_memory_saver's disk_backup example in torch mode: a region of the default tag backed up
    # to disk beside one without a backup. PyTorch's caching allocator asks the region's pool for a
    # 2 MiB small-pool segment (the 7-byte tensor) and a 14 MiB one (the ~13.4 MB tensor); in this
    # order tagmem serves both from one mapping, and each pause still leaves one file per
    # allocation, holding its bytes and nothing of the mapping's free memory (the same total every
    # cycle); each resume brings back the disk-backed bytes exactly and removes the files.
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    disk_dir = tmp_path / "spill"
    saver.set_disk_backup_dir(str(disk_dir))  # created by the saver
    tag = f"d{rng.randrange(1 << 30)}"
    sizes = [2 << 20, 14 << 20]
    with saver.region(tag=tag, enable_disk_backup=True):
        spilled = [tagmem.raw_alloc(n) for n in sizes]
    with saver.region(tag=tag):
        dropped = tagmem.raw_alloc(1 << 20)
    data = [rng.randbytes(n) for n in sizes]
    for ptr, d in zip(spilled, data):
        io.write(ptr, d)
    assert [tagmem.pointer_info(p)["tag"] for p in (*spilled, dropped)] == [tag, tag, tag + "+no_backup"]
    assert (tag, False, True, "", 0) in saver._impl._mem_pools
    totals = set()
    for _ in range(3):
        saver.pause()
        assert tagmem.state(tag) == "offloaded_disk"
        assert tagmem.state(tag + "+no_backup") == "offloaded_discard"
        files = list(disk_dir.iterdir())
        assert len(files) == len(sizes) and sum(f.stat().st_size for f in files) == sum(sizes)
        totals.add(sum(f.stat().st_size for f in files))
        saver.resume()
        assert [io.read(p, n) for p, n in zip(spilled, sizes)] == data
        assert list(disk_dir.iterdir()) == []
    assert len(totals) == 1
    for ptr in (*spilled, dropped):
        tagmem.raw_free(ptr)


def test_a_disk_backup_that_cannot_be_written_raises_and_leaves_the_region_active(
    torch_free, io, rng, tmp_path
):
    # torch_memory_saver's disk backup where no file can be made (the directory replaced by a
    # regular file): pause() raises DiskIOError (an OSError) and tms_pause returns
    # TAGMEM_ERROR_IO (15), the region stays active with its bytes, no file is left, and once the
    # directory is back the same pause and resume work.
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    cdll = saver._ensure_initialized()._binary_wrapper.cdll
    disk_dir = tmp_path / "spill"
    saver.set_disk_backup_dir(str(disk_dir))
    tag = f"e{rng.randrange(1 << 30)}"
    with saver.region(tag=tag, enable_disk_backup=True):
        ptr = tagmem.raw_alloc(4 << 20)
    data = rng.randbytes(4 << 20)
    io.write(ptr, data)
    disk_dir.rmdir()
    disk_dir.write_bytes(b"not a directory")
    with pytest.raises(tagmem.DiskIOError) as raised:
        saver.pause(tag)
    assert isinstance(raised.value, OSError) and str(disk_dir) in str(raised.value)
    assert cdll.tms_pause(tag.encode()) == 15
    assert tagmem.state(tag) == "resident" and io.read(ptr, 4 << 20) == data
    disk_dir.unlink()
    disk_dir.mkdir()
    saver.pause(tag)
    assert tagmem.state(tag) == "offloaded_disk" and len(list(disk_dir.iterdir())) == 1
    saver.resume(tag)
    assert io.read(ptr, 4 << 20) == data and list(disk_dir.iterdir()) == []
    tagmem.raw_free(ptr)


def test_disk_and_cpu_backup_together_are_refused(torch_free):
    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    with pytest.raises(ValueError):
        with saver.region(enable_cpu_backup=True, enable_disk_backup=True):
            pass


def test_sglang_release_and_resume_order_with_the_weights_written_between_resumes(
    torch_free, io, rng, monkeypatch
):
    # The order SGLang's scheduler releases and resumes its regions in, from the GPU test's
    # standin (tests/torch/standins/sglang_release_order.py), on the plain tag API.
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins"))
    import sglang_release_order as sglang

    saver = dropin.TorchMemorySaver()
    saver.hook_mode = "torch"
    nbytes = rng.randrange(1, 32) << 14
    pointers = {}
    for tag in ("weights", "kv_cache", "cuda_graph"):
        with saver.region(tag=tag, enable_cpu_backup=tag == "weights"):
            pointers[tag] = tagmem.raw_alloc(nbytes)
    old, new = rng.randbytes(nbytes), rng.randbytes(nbytes)
    io.write(pointers["weights"], old)
    sglang.release(saver)
    assert [tagmem.state(t) for t in sglang.RELEASE_ORDER] == [
        "offloaded_discard", "offloaded_backup", "offloaded_discard"]
    seen = []

    def update_weights():
        seen.append([tagmem.state(t) for t in sglang.RESUME_ORDER])
        seen.append(io.read(pointers["weights"], nbytes) == old)
        io.write(pointers["weights"], new)

    sglang.resume(saver, update_weights)
    assert seen == [["resident", "resident", "offloaded_discard"], True]
    assert io.read(pointers["weights"], nbytes) == new
    for p in pointers.values():
        tagmem.raw_free(p)
