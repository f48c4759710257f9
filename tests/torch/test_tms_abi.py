"""torch_memory_saver's C functions (tms_*) as the preload shim exports them, called the way
torch_memory_saver's Python side and its callers call them (ctypes on the process, with the
signatures torch_memory_saver's binary_wrapper declares): per-thread configuration, pause and
resume of every configured tag or one, CPU backup pointers, retention and the "mmap" backend's
release of host memory after resume.

Each case runs in a child started under LD_PRELOAD=libtagmem_preload.so (the emulated driver in CI,
the real one in gpu_run.sh; no PyTorch). Device bytes are random and compared byte for byte.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tagmem import _preload

HERE = os.path.dirname(os.path.abspath(__file__))

PRELUDE = """
    import ctypes, json, os, random, sys
    sys.path.insert(0, {here!r})
    import tagmem
    from device_io import DeviceIO
    c = ctypes.c_char_p
    p = ctypes.CDLL(None)
    for name, res, args in [
        ("tms_set_current_tag", None, [c]), ("tms_get_current_tag", c, []),
        ("tms_set_interesting_region", None, [ctypes.c_bool]),
        ("tms_get_interesting_region", ctypes.c_bool, []),
        ("tms_set_enable_cpu_backup", None, [ctypes.c_bool]),
        ("tms_get_enable_cpu_backup", ctypes.c_bool, []),
        ("tms_set_cpu_backup_backend", None, [c]), ("tms_get_cpu_backup_backend", c, []),
        ("tms_set_enable_disk_backup", None, [ctypes.c_bool]),
        ("tms_get_enable_disk_backup", ctypes.c_bool, []),
        ("tms_set_disk_backup_dir", None, [c]),
        ("tms_pause", ctypes.c_int, [c]), ("tms_resume", ctypes.c_int, [c]),
        ("tms_set_retain_cpu_backup", None, [ctypes.c_bool]),
        ("tms_get_retain_cpu_backup", ctypes.c_bool, []),
        ("set_memory_margin_bytes", None, [ctypes.c_uint64]),
        ("tms_get_cpu_backup_pointer", ctypes.POINTER(ctypes.c_uint8),
         [ctypes.POINTER(ctypes.c_uint8), ctypes.c_uint64]),
        ("cudaMalloc", ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
        ("cudaFree", ctypes.c_int, [ctypes.c_void_p])]:
        f = getattr(p, name); f.restype = res; f.argtypes = args
    io = DeviceIO(0)
    rng = random.Random({seed})

    def malloc(n):
        ptr = ctypes.c_void_p()
        assert p.cudaMalloc(ctypes.byref(ptr), n) == 0
        return ptr.value

    def filled(n):
        ptr = malloc(n)
        data = bytes(rng.getrandbits(8) for _ in range(n)) if n < 65536 else rng.randbytes(n)
        io.write(ptr, data)
        return ptr, data

    def set_config(tag, interesting, backup, backend=None, disk=None):  # torch_memory_saver's order
        p.tms_set_current_tag(tag.encode())
        p.tms_set_interesting_region(interesting)
        p.tms_set_enable_cpu_backup(backup)
        if backend is not None:
            p.tms_set_cpu_backup_backend(backend.encode())
        if disk is not None:
            p.tms_set_enable_disk_backup(disk)

    def backup_bytes(ptr, n):
        host = p.tms_get_cpu_backup_pointer(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), n)
        return ctypes.string_at(host, n) if host else None
"""


@pytest.fixture
def run_under_shim(rng):
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"

    def run(code, env_changes):
        env = dict(os.environ)
        env.pop("TAGMEM_LIBRARY", None)  # the shim is libtagmem here
        env.update({"LD_PRELOAD": shim, **env_changes})
        prelude = textwrap.dedent(PRELUDE).format(here=HERE, seed=rng.getrandbits(32))
        done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def test_regions_configured_through_the_c_functions_pause_and_resume_by_their_backup_wish(
    run_under_shim,
):
    # torch_memory_saver's nested-region example under TMS_INIT_ENABLE=1 and
    # TMS_INIT_ENABLE_CPU_BACKUP=1: the default tag is backed up, a region without a backup is not,
    # and the configuration comes back after the region.
    out = run_under_shim(
        """
        out = {"init": [p.tms_get_interesting_region(), p.tms_get_enable_cpu_backup(),
                        p.tms_get_current_tag().decode(), p.tms_get_cpu_backup_backend().decode()]}
        a, da = filled(6912)  # not a multiple of any granularity
        set_config("grads", True, False)
        out["inside"] = [p.tms_get_interesting_region(), p.tms_get_enable_cpu_backup(),
                         p.tms_get_current_tag().decode()]
        g, dg = filled(3 << 20)
        set_config("default", True, True)
        out["after"] = [p.tms_get_current_tag().decode(), p.tms_get_enable_cpu_backup()]
        b, db = filled(5000)
        out["owners"] = [tagmem.pointer_info(x)["tag"] for x in (a, g, b)]
        out["pause"] = p.tms_pause(None)
        out["states"] = [tagmem.state("default"), tagmem.state("grads")]
        out["backup"] = [backup_bytes(a, len(da)) == da, backup_bytes(g, len(dg))]
        out["pause_again"] = p.tms_pause(b"grads")
        out["resume"] = p.tms_resume(None)
        out["kept"] = [io.read(a, len(da)) == da, io.read(b, len(db)) == db]
        out["after_resume"] = backup_bytes(a, len(da))
        out["resume_again"] = p.tms_resume(b"default")
        out["unknown"] = [p.tms_pause(b"no_such_tag"), p.tms_resume(b"no_such_tag")]
        io.write(g, dg)  # the grads came back without their bytes: writable again
        out["grads"] = io.read(g, len(dg)) == dg
        print(json.dumps(out))
        """,
        {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
    )
    assert out["init"] == [True, True, "default", "pinned"]
    assert out["inside"] == [True, False, "grads"]
    assert out["after"] == ["default", True]
    assert out["owners"] == ["default", "grads", "default"]
    assert out["pause"] == 0 and out["states"] == ["offloaded_backup", "offloaded_discard"]
    assert out["backup"] == [True, None]
    assert out["pause_again"] == 3  # TAGMEM_ERROR_TAG_OFFLOADED: tagmem is stricter here
    assert out["resume"] == 0 and out["kept"] == [True, True] and out["after_resume"] is None
    assert out["resume_again"] == 4 and out["unknown"] == [0, 0]  # nothing to pause
    assert out["grads"]


def test_a_retaining_resume_keeps_the_copy_and_a_free_while_paused_is_honoured(run_under_shim):
    out = run_under_shim(
        """
        out = {"retain_env": p.tms_get_retain_cpu_backup()}
        p.tms_set_retain_cpu_backup(False)
        set_config("w", True, True)
        w, dw = filled(2 << 20)
        x, dx = filled(4096)
        set_config("default", False, False)
        out["routed_after"] = p.tms_get_interesting_region()
        with tagmem.tag("scoped"):  # the thread's routing is as before: tag scopes decide
            out["scoped"] = tagmem.pointer_info(malloc(4096))["tag"]
        p.tms_set_retain_cpu_backup(True)
        out["retain"] = p.tms_get_retain_cpu_backup()
        assert p.tms_pause(b"w") == 0
        out["free_paused"] = p.cudaFree(x)
        assert p.tms_resume(b"w") == 0
        out["kept"] = backup_bytes(w, len(dw)) == dw and io.read(w, len(dw)) == dw
        p.tms_set_retain_cpu_backup(False)
        assert p.tms_pause(b"w") == 0 and p.tms_resume(b"w") == 0
        out["given_back"] = backup_bytes(w, len(dw)) is None and io.read(w, len(dw)) == dw
        out["live"] = tagmem.stats("w")["live_allocations"]
        print(json.dumps(out))
        """,
        {"TMS_RETAIN_CPU_BACKUP": "1"},
    )
    assert out == {"retain_env": True, "routed_after": False, "scoped": "scoped", "retain": True,
                   "free_paused": 0, "kept": True, "given_back": True, "live": 1}


def test_the_mmap_backend_gives_host_memory_back_after_resume_and_pinned_keeps_the_store(
    run_under_shim,
):
    out = run_under_shim(
        """
        out = {"env": p.tms_get_cpu_backup_backend().decode()}
        n = 8 << 20
        set_config("pinned_w", True, True, "pinned")
        a, da = filled(n)
        set_config("mmap_w", True, True, "mmap")
        out["backend"] = p.tms_get_cpu_backup_backend().decode()
        b, db = filled(n)
        set_config("default", False, False)
        host = lambda: tagmem.stats()["host_pinned_bytes"]

        def mapped(addr):  # whether any mapping of this process holds the address
            for line in open("/proc/self/maps"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= addr < hi:
                    return True
            return False

        assert p.tms_pause(b"pinned_w") == 0 and p.tms_resume(b"pinned_w") == 0
        pinned = host()
        out["pinned_kept"] = pinned >= n
        assert p.tms_pause(b"mmap_w") == 0
        out["paused"] = host() >= pinned + n and backup_bytes(b, n) == db
        old = ctypes.cast(p.tms_get_cpu_backup_pointer(
            ctypes.cast(b, ctypes.POINTER(ctypes.c_uint8)), n), ctypes.c_void_p).value
        assert p.tms_resume(b"mmap_w") == 0
        # The mmap region's host memory is gone from the process; the pinned region's stays.
        out["released"] = [host() == pinned, mapped(old)]
        assert p.tms_pause(b"pinned_w") == 0  # ...and serves its next pause without pinning
        out["repaused"] = host() == pinned and backup_bytes(a, n) == da
        assert p.tms_resume(b"pinned_w") == 0
        out["bytes"] = io.read(a, n) == da and io.read(b, n) == db
        p.tms_set_cpu_backup_backend(b"floppy")  # refused: nothing changes
        out["refused"] = p.tms_get_cpu_backup_backend().decode()
        p.tms_set_enable_disk_backup(True)  # the thread's disk wish, as torch_memory_saver's
        out["disk"] = p.tms_get_enable_disk_backup()
        print(json.dumps(out))
        """,
        {"TMS_INIT_CPU_BACKUP_BACKEND": "mmap"},
    )
    assert out["env"] == "mmap" and out["backend"] == "mmap"
    assert out["pinned_kept"] and out["paused"] and out["bytes"] and out["repaused"]
    assert out["released"] == [True, False]
    assert out["refused"] == "mmap" and out["disk"] is True


def test_one_tag_with_and_without_a_backup_keeps_only_the_backed_up_bytes(run_under_shim):
    # torch_memory_saver decides per allocation: two regions of one tag, one asking for a CPU
    # backup and one not, pause together; only the first keeps its bytes. The second wish is a
    # tagmem tag of its own, named after the first.
    out = run_under_shim(
        """
        out = {}
        set_config("default", True, True, "mmap")
        a, da = filled(3 << 20)
        set_config("default", False, False)
        set_config("default", True, False)
        b, db = filled(5000)
        set_config("default", True, True, "pinned")  # the backed-up wish again, other backend
        c, dc = filled(4096)
        set_config("default", False, False)
        out["owners"] = [tagmem.pointer_info(x)["tag"] for x in (a, b, c)]
        out["pause"] = p.tms_pause(b"default")
        out["states"] = [tagmem.state("default"), tagmem.state("default+no_backup")]
        out["backup"] = [backup_bytes(a, len(da)) == da, backup_bytes(b, len(db)),
                         backup_bytes(c, len(dc)) == dc]
        out["pause_again"] = p.tms_pause(b"default")
        out["resume"] = p.tms_resume(b"default")
        out["kept"] = [io.read(a, len(da)) == da, io.read(c, len(dc)) == dc]
        out["resume_again"] = p.tms_resume(b"default")
        io.write(b, db)  # given back without its bytes, writable again
        out["rewritten"] = io.read(b, len(db)) == db
        print(json.dumps(out))
        """,
        {},
    )
    assert out["owners"] == ["default", "default+no_backup", "default"]
    assert out["pause"] == 0 and out["states"] == ["offloaded_backup", "offloaded_discard"]
    assert out["backup"] == [True, None, True]
    assert out["pause_again"] == 3 and out["resume"] == 0 and out["resume_again"] == 4
    assert out["kept"] == [True, True] and out["rewritten"]


def test_a_retained_copy_stays_at_its_host_address_across_resume_and_the_next_pause(
    run_under_shim,
):
    out = run_under_shim(
        """
        out = {}
        set_config("kept", True, True)
        w, dw = filled(4096)
        set_config("default", False, False)
        addr = lambda: ctypes.cast(p.tms_get_cpu_backup_pointer(
            ctypes.cast(w, ctypes.POINTER(ctypes.c_uint8)), len(dw)), ctypes.c_void_p).value
        assert p.tms_pause(b"kept") == 0
        first = addr()
        p.tms_set_retain_cpu_backup(True)
        assert p.tms_resume(b"kept") == 0
        out["resumed"] = [addr() == first, backup_bytes(w, len(dw)) == dw]
        dw2 = rng.randbytes(len(dw))
        io.write(w, dw2)
        assert p.tms_pause(b"kept") == 0
        out["repaused"] = [addr() == first, backup_bytes(w, len(dw)) == dw2]
        p.tms_set_retain_cpu_backup(False)
        assert p.tms_resume(b"kept") == 0
        out["released"] = [addr() is None, io.read(w, len(dw)) == dw2]
        print(json.dumps(out))
        """,
        {},
    )
    assert out == {"resumed": [True, True], "repaused": [True, True], "released": [True, True]}


def test_a_disk_wish_pauses_to_files_in_the_directory_set_and_brings_the_bytes_back(
    run_under_shim, tmp_path
):
    # torch_memory_saver's disk_backup example through the C functions: one tag with regions
    # backed up to disk and regions without a backup; the disk directory is made by
    # tms_set_disk_backup_dir; every cycle writes the same files and the resume removes them.
    out = run_under_shim(
        """
        spill = {spill!r}
        p.tms_set_disk_backup_dir(spill.encode())
        set_config("default", True, False, disk=True)
        out = {{"inside": [p.tms_get_enable_disk_backup(), p.tms_get_enable_cpu_backup()]}}
        big, dbig = filled((13 << 20) + 4321)
        small, dsmall = filled(7)
        set_config("default", True, False, disk=False)
        gone, _ = filled(1 << 20)
        set_config("default", False, False, disk=False)
        out["owners"] = [tagmem.pointer_info(x)["tag"] for x in (big, small, gone)]
        out["cycles"] = []
        for _ in range(3):
            assert p.tms_pause(None) == 0
            files = sorted(os.listdir(spill))
            states = [tagmem.state(n) for n in ("default", "default+no_backup")]
            total = sum(os.path.getsize(os.path.join(spill, f)) for f in files)
            no_copy = backup_bytes(big, 16) is None
            assert p.tms_resume(None) == 0
            out["cycles"].append([len(files), total, states, no_copy,
                                  io.read(big, len(dbig)) == dbig and io.read(small, 7) == dsmall,
                                  os.listdir(spill)])
        print(json.dumps(out))
        """.format(spill=str(tmp_path / "spill" / "deeper")),
        {},
    )
    assert out["inside"] == [True, False]
    assert out["owners"] == ["default", "default", "default+no_backup"]
    first = out["cycles"][0]
    assert first[0] >= 2 and first[1] >= (13 << 20) + 4321
    for cycle in out["cycles"]:
        assert cycle == [first[0], first[1], ["offloaded_disk", "offloaded_discard"], True, True, []]


def test_a_freed_allocations_cpu_backup_is_no_longer_pinned(run_under_shim):
    # torch_memory_saver's cpu_backup example, last step: a backed-up allocation's copy, retained
    # across a resume or taken while paused, is no longer pinned host memory once the allocation
    # is freed (the driver's host-flags query fails on the old pointer).
    out = run_under_shim(
        """
        flags = ctypes.c_uint()
        def pinned(host):
            io._make_current()
            return io.cu.cuMemHostGetFlags(ctypes.byref(flags), ctypes.c_void_p(host)) == 0
        def address(ptr, n):
            host = p.tms_get_cpu_backup_pointer(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), n)
            return ctypes.cast(host, ctypes.c_void_p).value
        out = {}
        p.tms_set_retain_cpu_backup(True)
        for state in ("active", "paused"):
            tag = "retained_free_" + state
            set_config(tag, True, True)
            x, dx = filled(2 << 20)  # a segment of its own, as PyTorch's small pool asks
            set_config("default", False, False)
            assert p.tms_pause(tag.encode()) == 0
            host = address(x, len(dx))
            seen = [ctypes.string_at(host, len(dx)) == dx, pinned(host)]
            if state == "active":
                assert p.tms_resume(tag.encode()) == 0
                seen += [address(x, len(dx)) == host, io.read(x, len(dx)) == dx]
            assert p.cudaFree(x) == 0
            seen.append(pinned(host))
            out[state] = seen
        print(json.dumps(out))
        """,
        {},
    )
    assert out == {"active": [True, True, True, True, False], "paused": [True, True, False]}


def test_with_early_return_a_pause_drops_first_and_returns_with_the_copies_running(
    run_under_shim, io
):
    # An engine's pause of every tag with TAGMEM_OFFLOAD_RETURN=queued: the kv cache, which has no
    # backup, is unmapped first (an offload begins by waiting for the device, whose work would
    # otherwise hold the weights' copies), and the pause returns with the weights' copies still
    # running (the emulated copies slowed to 1 MiB/s: the weights take seconds), not after them.
    # The weights' bytes come back whole at the resume.
    if not io.is_emulator():
        pytest.skip("slows the emulated driver's copies")
    out = run_under_shim(
        """
        emu = io.cu
        emu.tagmem_emu_live_mappings.restype = ctypes.c_uint64
        set_config("engine", True, True)
        w, dw = filled(4 << 20)
        set_config("engine", True, False)
        kv, dkv = filled(4 << 20)
        set_config("default", False, False)
        kv_maps = tagmem.stats("engine+no_backup")["mappings"]
        before = emu.tagmem_emu_live_mappings()
        emu.tagmem_emu_set_copy_bytes_per_second(ctypes.c_uint64(1 << 20))
        out = {"kv_maps": kv_maps, "pause": p.tms_pause(None)}
        out["unmapped"] = before - emu.tagmem_emu_live_mappings()
        emu.tagmem_emu_set_copy_bytes_per_second(ctypes.c_uint64(0))
        out["states"] = [tagmem.state("engine"), tagmem.state("engine+no_backup")]
        out["resume"] = p.tms_resume(None)
        out["kept"] = io.read(w, len(dw)) == dw
        print(json.dumps(out))
        """,
        {"TAGMEM_OFFLOAD_RETURN": "queued"},
    )
    assert out["pause"] == 0 and out["kv_maps"] > 0
    assert out["unmapped"] == out["kv_maps"]  # the kv cache's mappings, none of the weights'
    assert out["states"] == ["offloaded_backup", "offloaded_discard"]
    assert out["resume"] == 0 and out["kept"]
