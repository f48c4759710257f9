#!/usr/bin/env python3
"""Runs the two-process switch with the calls at once and TAGMEM_TRACE on (one file per process),
then reads the traces with plots/switch_rates.py: every switch is found with both processes' calls
overlapping in time (their traces share one clock), each process copies back in as many bytes as
it copied out, and each reload's copy mark is taken and let go within its switch.

  check_switch_rates.py BENCH_OFFLOAD [ARGS...]
"""
import glob
import io
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots"))
import switch_rates  # noqa: E402


def check_short_span():
    # A copy of a few nanoseconds late on the monotonic clock is counted whole, no more.
    ts = 5983034358.253
    span = {"cat": "copy", "name": "copy D2H", "pid": 1, "ts": ts, "dur": 0.0,
            "args": {"bytes": 50331648}}
    _, moved = switch_rates.rates([span], ts - 4774.832, ts + 197589.0, 20e3)
    assert moved[(1, "D2H")] == 50331648, moved


def main():
    check_short_span()
    cycles = 2
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TAGMEM_TRACE=os.path.join(tmp, "t-%p.json"))
        subprocess.run(sys.argv[1:] + ["--scenarios=rl_two_process", "--rl-variants=overlap",
                                       "--rl-two-shapes=roomy", "--cycles=%d" % cycles],
                       check=True, stdout=subprocess.DEVNULL, env=env)
        spans, counters = switch_rates.load(glob.glob(os.path.join(tmp, "t-*.json")))
    found = switch_rates.switches(spans)
    assert len(found) == 2 * cycles, [(r["pid"], len(o)) for r, o in found]
    copied = {}  # (pid, direction) -> bytes, per switch
    for r, outs in found:
        lo, hi = switch_rates.window(spans, r, outs)
        # Called at once: the reload starts before the last offload ends.
        assert r["ts"] < max(c["ts"] + c["dur"] for c in outs), (r, outs)
        _, moved = switch_rates.rates(spans, lo, hi, 20e3)
        into = moved[(r["pid"], "H2D")]
        out_pids = {c["pid"] for c in outs}
        assert len(out_pids) == 1 and into > 0, (out_pids, dict(moved))
        copied.setdefault((r["pid"], "H2D"), []).append(into)
        copied.setdefault((out_pids.pop(), "D2H"), []).append(sum(
            v for k, v in moved.items() if k[1] == "D2H" and k[0] != r["pid"]))
    for pid in {k[0] for k in copied}:
        ins, outs = copied[(pid, "H2D")], copied[(pid, "D2H")]
        assert all(abs(x - outs[0]) <= 1e-6 * outs[0] for x in ins + outs), (pid, ins, outs)
    text = io.StringIO()
    switch_rates.report(spans, 20.0, 0.5, text, counters)
    assert text.getvalue().count("switch into") == 2 * cycles, text.getvalue()
    # Each reload marks while it copies (handoff is on): its mark taken and let go in its switch.
    for r, outs in found:
        lo, hi = switch_rates.window(spans, r, outs)
        marks = [v for _, pid, name, v in switch_rates.state_changes(counters, lo, hi)
                 if pid == r["pid"] and name == "copy_mark"]
        assert marks[:1] == [1] and marks[-1:] == [0], (r["pid"], marks)
    assert text.getvalue().count(" copy_mark ") >= 4 * cycles, text.getvalue()
    print("check_switch_rates: OK: %d switches, %s" % (len(found), copied))


if __name__ == "__main__":
    main()
