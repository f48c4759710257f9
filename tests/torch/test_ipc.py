"""tagmem.ipc_export / ipc_open between two Python processes (no PyTorch): the other process maps
the tagged range, reads the exporter's bytes and writes its own, byte for byte; the handle
pickles; the tag cannot be offloaded while the range is open there (PeerError naming the
process) and can once it is closed or its mapping collected; a process of another job is
refused; without any job identity in either process (a plain script and its children) it works,
and a forged secret is still refused."""

import os
import pickle
import random
import subprocess
import sys
import time

import pytest

import tagmem

MiB = 1 << 20
_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def job(monkeypatch, tmp_path):
    monkeypatch.setenv("TAGMEM_JOB", f"ipc-py-{os.getpid()}")
    peers = tmp_path / "peers"
    peers.mkdir(mode=0o700)
    monkeypatch.setenv("TAGMEM_PEER_DIR", str(peers))
    tagmem.shutdown()  # the settings are read when tagmem starts


_JOB_VARIABLES = ("TAGMEM_JOB", "TAGMEM_NCCL_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


@pytest.fixture
def no_job(job, monkeypatch):
    for name in _JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    tagmem.shutdown()


class Child:
    def __init__(self, env=None):
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(_HERE, "ipc_child.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={
                k: v
                for k, v in {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(sys.path),
                    **(env or {}),
                }.items()
                if v is not None
            },
        )

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def exit(self):
        self.p.stdin.write("exit\n")
        self.p.stdin.close()
        assert self.p.wait(timeout=60) == 0


def seeded(seed, n):
    return random.Random(seed).randbytes(n)


def importers_become(n):
    for _ in range(1000):
        if tagmem.ipc_stats()["importers"] == n:
            return True
        time.sleep(0.01)
    return False


def exported(io, rng, size):
    """A tagged range of `size` bytes filled from a random seed, exported: (ptr, handle, seed)."""
    ptr = tagmem.raw_alloc(size, tag="w")
    seed = rng.randrange(1 << 60)
    io.write(ptr, seeded(seed, size))
    return ptr, tagmem.ipc_export(ptr, size), seed


def test_another_process_reads_and_writes_the_tagged_range(job, io, rng):
    size = 3 * MiB + 512
    ptr, handle, seed = exported(io, rng, size)
    seed2 = rng.randrange(1 << 60)
    assert pickle.loads(pickle.dumps(handle)) == handle and len(handle.data) == 64
    child = Child()
    try:
        assert child.ask("open " + pickle.dumps(handle).hex()) == f"opened {size} 0"
        assert child.ask(f"check {seed}") == "same"
        assert child.ask(f"write {seed2}") == "written"
        assert io.read(ptr, size) == seeded(seed2, size)
        assert tagmem.ipc_stats()["importers"] == 1
        with pytest.raises(tagmem.PeerError, match=f"pid {child.p.pid}"):
            tagmem.offload("w")
        assert child.ask("close") == "closed"
        assert importers_become(0)
        tagmem.offload("w")
        tagmem.reload("w")
        assert io.read(ptr, size) == seeded(seed2, size)
        # A mapping nobody references closes itself.
        assert child.ask("open " + pickle.dumps(handle).hex()) == f"opened {size} 0"
        assert child.ask("drop") == "dropped"
        assert importers_become(0)
        assert "'open_here': 0" in child.ask("stats")
    finally:
        child.exit()
    tagmem.raw_free(ptr)
    assert tagmem.ipc_stats()["exports"] == 0


def test_a_process_of_another_job_is_refused(job, io):
    ptr = tagmem.raw_alloc(2 * MiB, tag="w")
    handle = tagmem.ipc_export(ptr, 2 * MiB)
    child = Child({"TAGMEM_JOB": "someone-else"})
    try:
        answer = child.ask("open " + pickle.dumps(handle).hex())
        assert answer.startswith("error PeerError") and "someone-else" in answer, answer
    finally:
        child.exit()
    assert tagmem.ipc_stats()["refused_peers"] == 1
    with pytest.raises(tagmem.InvalidArgumentError):
        tagmem.ipc_open(handle)  # this process's own export
    with pytest.raises(tagmem.InvalidArgumentError):
        tagmem.IpcHandle(b"short")
    tagmem.raw_free(ptr)


def test_processes_without_a_job_identity(no_job, io, rng):
    size = 2 * MiB + 4096
    ptr, handle, seed = exported(io, rng, size)
    seed2 = rng.randrange(1 << 60)
    child = Child()  # inherits the environment: no job variable either
    try:
        assert not any(os.environ.get(name) for name in _JOB_VARIABLES)
        assert child.ask("open " + pickle.dumps(handle).hex()) == f"opened {size} 0"
        assert child.ask(f"check {seed}") == "same"
        assert child.ask(f"write {seed2}") == "written"
        assert io.read(ptr, size) == seeded(seed2, size)
        assert child.ask("close") == "closed"
        forged = bytearray(handle.data)
        forged[40] ^= 0x5A  # the secret
        answer = child.ask("open " + pickle.dumps(tagmem.IpcHandle(bytes(forged))).hex())
        assert answer.startswith("error PeerError") and "with that secret" in answer, answer
    finally:
        child.exit()
    tagmem.raw_free(ptr)
