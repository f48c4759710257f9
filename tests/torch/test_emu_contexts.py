"""Which devices tagmem holds a context on, counted by the emulated driver (so this file runs on
the emulated driver only): a process that uses only device k makes no context on device 0, host
backups included (Note [the host store's context] in allocator/registry/registry.cpp).
"""

import ctypes
import os

import tagmem


def test_a_backup_on_device_k_retains_no_context_on_device_0(io, rng):
    # `io` holds device 0's context for the tests' copies: count only what tagmem adds.
    emu = ctypes.CDLL(os.environ["TAGMEM_LIBCUDA"])
    emu.tagmem_emu_call_count.restype = ctypes.c_uint64
    emu.tagmem_emu_device_count.restype = ctypes.c_int
    assert emu.tagmem_emu_device_count() >= 2
    tagmem.shutdown()
    before = emu.tagmem_emu_call_count(b"cuDevicePrimaryCtxRetain")
    nbytes = rng.randrange(1, 64) << 16
    tagmem.raw_alloc(nbytes, tag="w", device=1)
    tagmem.offload("w", device=1)
    assert tagmem.stats("w", device=1)["host_bytes"] >= nbytes
    tagmem.reload("w", device=1)
    assert emu.tagmem_emu_call_count(b"cuDevicePrimaryCtxRetain") - before == 1  # device 1's


def test_pausing_every_tms_tag_starts_nothing_on_devices_without_them(rng):
    # torch_memory_saver's tms_pause(NULL), as the preload shim exports it, on a process whose
    # tags live on device 1 only: device 0 gets no context from it.
    import json
    import subprocess
    import sys
    import textwrap

    from tagmem import _preload

    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest sets it)"
    code = f"""
        import ctypes, json, os, tagmem
        emu = ctypes.CDLL(os.environ["TAGMEM_LIBCUDA"])
        emu.tagmem_emu_call_count.restype = ctypes.c_uint64
        retains = lambda: emu.tagmem_emu_call_count(b"cuDevicePrimaryCtxRetain")
        p = ctypes.CDLL(None)
        p.tms_pause.argtypes = p.tms_resume.argtypes = [ctypes.c_char_p]
        p.tms_set_current_tag.argtypes = [ctypes.c_char_p]
        p.tms_set_interesting_region.argtypes = [ctypes.c_bool]
        p.tms_set_current_tag(b"w")
        p.tms_set_interesting_region(True)  # records "w" as a torch_memory_saver tag
        before = retains()
        tagmem.raw_alloc({rng.randrange(1, 64) << 16}, tag="w", device=1)
        out = [p.tms_pause(None), tagmem.state("w", device=1), p.tms_resume(None)]
        print(json.dumps(out + [retains() - before]))
    """
    env = {k: v for k, v in os.environ.items() if k != "TAGMEM_LIBRARY"}
    env["LD_PRELOAD"] = shim
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, "offloaded_discard", 0, 1]
