"""Handoff through the torch_memory_saver drop-in's C functions, as an engine and a trainer call
them in two processes on one GPU (docs/handoff.md): with TAGMEM_HANDOFF=on and one job, the
memory a tms_pause gives up goes to the other process, whose paused tag takes it at its
tms_resume without the driver making memory, and the paused side's backed-up bytes come back
whole. Both processes run under LD_PRELOAD=libtagmem_preload.so on one emulated GPU that they
count together (TAGMEM_EMU_SHARED_DEVICES); no PyTorch.
"""

import json
import os
import subprocess
import sys
import textwrap

from tagmem import _preload
from test_tms_abi import HERE, PRELUDE

# Each line on stdin is a command; each answer one JSON line on stdout.
SERVE = """
    held = {}
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "alloc":  # TAG BACKUP(0|1) BYTES
            set_config(args[0], True, args[1] == "1")
            held[args[0]] = filled(int(args[2]))
            set_config("default", False, False)
            out = {"ok": True}
        elif cmd in ("pause", "resume"):
            out = {"status": getattr(p, "tms_" + cmd)(args[0].encode())}
        elif cmd == "same":
            ptr, data = held[args[0]]
            out = {"same": io.read(ptr, len(data)) == data}
        elif cmd == "handoff":
            out = tagmem.handoff_stats()
        else:
            break
        print(json.dumps(out), flush=True)
"""


class Side:
    def __init__(self, env, seed):
        prelude = textwrap.dedent(PRELUDE).format(here=HERE, seed=seed)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(SERVE)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def ask(self, *words):
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0, self.proc.stderr.read()


def test_a_pause_hands_its_memory_to_the_other_process_which_maps_it_at_its_resume(rng, tmp_path):
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    peers = tmp_path / "peers"
    peers.mkdir(mode=0o700)
    env = dict(os.environ)
    env.pop("TAGMEM_LIBRARY", None)  # the shim is libtagmem here
    env.update({
        "LD_PRELOAD": shim, "TAGMEM_HANDOFF": "on", "TAGMEM_PEER_DIR": str(peers),
        "TAGMEM_JOB": f"handoff-dropin-{rng.getrandbits(32)}",
        "TAGMEM_EMU_SHARED_DEVICES": str(peers / "emu-devices"),
        "TAGMEM_HOST_SLAB_BYTES": "16MiB",
    })
    nbytes = 48 << 20
    engine, trainer = Side(env, rng.getrandbits(32)), Side(env, rng.getrandbits(32))
    try:
        assert engine.ask("alloc", "kv", 0, nbytes) == {"ok": True}  # no backup: DISCARD
        assert trainer.ask("alloc", "weights", 1, nbytes) == {"ok": True}  # a CPU backup
        # The engine sleeps: a process with a paused tag takes what the job's processes give up.
        assert engine.ask("pause", "kv") == {"status": 0}
        assert trainer.ask("pause", "weights") == {"status": 0}
        given = trainer.ask("handoff")["given_bytes"]
        assert given >= nbytes, given
        assert engine.ask("resume", "kv") == {"status": 0}
        took = engine.ask("handoff")
        assert took["received_bytes"] >= nbytes and took["mapped_received_bytes"] >= nbytes, took
        # The trainer's bytes come back from its backup, whole (the engine sleeps again first,
        # handing the memory back the other way).
        assert trainer.ask("handoff")["listening"] == 1
        assert engine.ask("pause", "kv") == {"status": 0}
        assert trainer.ask("resume", "weights") == {"status": 0}
        assert trainer.ask("same", "weights") == {"same": True}
        assert trainer.ask("handoff")["mapped_received_bytes"] >= nbytes
    finally:
        for side in (engine, trainer):
            side.close()
