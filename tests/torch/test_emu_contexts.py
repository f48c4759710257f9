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
