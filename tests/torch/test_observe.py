"""The trace file of a process that ends by SIGTERM or SIGINT, and tagmem.trace_flush(): child
processes with TAGMEM_TRACE set, on the emulated driver or a GPU. No PyTorch.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

import tagmem

# The child: one tag, offloaded and reloaded, then "ready" on stdout and waiting for its stdin to
# close (it never does: the test ends it by a signal). With "flush" it first writes the trace.
_CHILD = """
import sys, tagmem
with tagmem.tag("signal_weights"):
    ptr = tagmem.raw_alloc(int(sys.argv[1]))
tagmem.offload("signal_weights")
tagmem.reload("signal_weights")
if sys.argv[2] == "flush":
    tagmem.trace_flush()
print("ready", flush=True)
sys.stdin.read()
"""


def start_child(tmp_path, nbytes, mode="wait"):
    path = tmp_path / "trace.json"
    env = dict(os.environ, TAGMEM_TRACE=str(path))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(nbytes), mode],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    if line != "ready\n":
        child.kill()
        _, err = child.communicate(timeout=60)
        pytest.fail(f"the child did not start: {line!r} {err}")
    return child, path


def offload_bytes(path):
    """The offload spans in the trace file at `path` (whole, valid JSON) and the bytes its copies
    to the host moved (the tag's mapped segments: at least the allocation)."""
    with open(path) as f:
        trace = json.load(f)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    offloads = sum(1 for e in spans if e["name"] == "offload")
    copied = sum(
        e["args"]["bytes"]
        for e in spans
        if e["name"] == "copy D2H" and e["args"].get("tag") == "signal_weights"
    )
    return offloads, copied


def assert_one_offload_of(path, nbytes):
    offloads, copied = offload_bytes(path)
    assert offloads == 1
    assert copied >= nbytes


def test_a_process_ended_by_sigterm_leaves_its_trace_and_still_dies_by_the_signal(tmp_path, rng):
    nbytes = rng.randrange(1, 64) << 20
    child, path = start_child(tmp_path, nbytes)
    assert not path.exists()  # nothing written before the signal
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGTERM, err
    assert_one_offload_of(path, nbytes)


def test_sigint_writes_the_trace_and_python_still_raises_keyboard_interrupt(tmp_path, rng):
    nbytes = rng.randrange(1, 64) << 20
    child, path = start_child(tmp_path, nbytes)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert "KeyboardInterrupt" in err  # Python's own handler ran after tagmem's
    assert child.returncode == -signal.SIGINT, err
    assert_one_offload_of(path, nbytes)


def test_trace_flush_writes_the_trace_while_the_process_runs(tmp_path, rng):
    nbytes = rng.randrange(1, 64) << 20
    child, path = start_child(tmp_path, nbytes, mode="flush")
    try:
        assert_one_offload_of(path, nbytes)
    finally:
        child.kill()
        child.communicate(timeout=60)


def test_trace_flush_without_tagmem_trace_does_nothing_and_an_unwritable_path_raises(tmp_path):
    tagmem.trace_flush()  # this process has no TAGMEM_TRACE
    env = dict(os.environ, TAGMEM_TRACE=str(tmp_path / "missing_dir" / "trace.json"))
    probe = (
        "import tagmem\n"
        "tagmem.init()\n"
        "try:\n"
        "    tagmem.trace_flush()\n"
        "except tagmem.InvalidArgumentError as e:\n"
        "    print('raised', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("raised"), out.stderr
    assert "missing_dir" in out.stdout
