#!/usr/bin/env python3
"""Runs the demo with TAGMEM_TRACE and TAGMEM_LOG and checks what they say against each other.

  check_trace.py DEMO [--cycles N]

The trace must be valid JSON with one span per phase switch (as many as the demo makes and the
log reports), device-timed copy pieces inside their switch on per-stream tracks that never overlap,
copied bytes equal to the log line's, unmap/map/plan/pin/release spans, and counters whose last
values match the state the demo ends in. A second run with TAGMEM_LOG=debug must log driver calls.
"""
import bisect
import json
import os
import re
import subprocess
import sys
import tempfile

SLACK_US = 50.0  # rounding: a copy is never placed later than it ran (Note [trace clock])


def fail(msg):
    print("check_trace: FAIL: " + msg)
    sys.exit(1)


def run(demo, cycles, env_extra):
    env = dict(os.environ, **env_extra)
    p = subprocess.run([demo, "--cycles", str(cycles)], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        fail("demo exited %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    return p.stdout, p.stderr


# Every TAGMEM_LOG line starts with this: UTC time to the millisecond and the pid (the demo joins
# no NCCL group, so no rank).
STAMP = r"^tagmem: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z pid=(\d+) "


def log_lines(stderr):
    out = []
    for line in stderr.splitlines():
        m = re.match(STAMP + r"(offload|reload|swap)( FAILED)? (.*)$", line)
        if m:
            if m.group(3):
                fail("a switch failed: " + line)
            fields = dict(kv.split("=", 1) for kv in m.group(4).split())
            fields["pid"] = m.group(1)
            out.append((m.group(2), fields))
    return out


def main():
    demo = sys.argv[1]
    cycles = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        stdout, stderr = run(demo, cycles, {"TAGMEM_TRACE": path, "TAGMEM_LOG": "info"})
        with open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    counters = [e for e in events if e["ph"] == "C"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}

    # One span per switch, as many as the demo makes and the log reports, in the same order.
    switches = sorted((e for e in spans if e["name"] in ("offload", "reload", "swap")),
                      key=lambda e: e["ts"])
    expected = {"offload": 2 + cycles, "swap": 2 * cycles, "reload": cycles}
    for name, n in expected.items():
        got = sum(1 for e in switches if e["name"] == name)
        if got != n:
            fail("%d %s spans, expected %d" % (got, name, n))
    logged = log_lines(stderr)
    if [k for k, _ in logged] != [e["name"] for e in switches]:
        fail("log %s vs trace %s" % ([k for k, _ in logged], [e["name"] for e in switches]))
    # The log's pid is the process the trace's events come from.
    pids = {f["pid"] for _, f in logged} | {str(e["pid"]) for e in switches}
    if len(pids) != 1:
        fail("the log and the trace name several processes: %s" % sorted(pids))

    # Copy pieces: on their stream's track, inside their switch, bytes as the log says.
    copies = [e for e in spans if e["name"] in ("copy D2H", "copy H2D")]
    if not any(e["name"] == "copy D2H" for e in copies) or not any(
            e["name"] == "copy H2D" for e in copies):
        fail("copies of both directions expected")
    for c in copies:
        want = "copies " + c["name"].split()[1] + " "
        if not tracks.get(c["tid"], "").startswith(want):
            fail("copy on track %r" % tracks.get(c["tid"]))
    by_track = {}
    for c in copies:
        by_track.setdefault(c["tid"], []).append(c)
    for tid, cs in by_track.items():
        cs.sort(key=lambda e: e["ts"])
        for a, b in zip(cs, cs[1:]):
            if a["ts"] + a["dur"] > b["ts"] + 1.0:
                fail("copies overlap on track %s" % tracks[tid])
    # A copy starts after its switch queued it (so after the switch began) and is placed no later
    # than it ran (Note [trace clock]): it belongs to the last switch that began before it.
    starts = [sw["ts"] for sw in switches]
    owned = [[] for _ in switches]
    for c in copies:
        i = bisect.bisect_right(starts, c["ts"]) - 1
        if i < 0:
            fail("a copy at %.0f us before every switch" % c["ts"])
        sw = switches[i]
        if c["ts"] + c["dur"] > sw["ts"] + sw["dur"] + SLACK_US:
            fail("a copy of the %s at %.0f us ends %.0f us after it" %
                 (sw["name"], sw["ts"], c["ts"] + c["dur"] - sw["ts"] - sw["dur"]))
        owned[i].append(c)
    for sw, (_, fields), inside in zip(switches, logged, owned):
        copied = sum(c["args"]["bytes"] for c in inside)
        if copied != int(fields["copied_bytes"]):
            fail("%s at %.0f us (%.0f us): its copies move %d bytes, the log says %s" %
                 (sw["name"], sw["ts"], sw["dur"], copied, fields["copied_bytes"]))

    for name in ("plan", "unmap", "map", "pin", "release"):
        if not any(e["name"] == name for e in spans):
            fail("no %s span" % name)
    for e in spans:
        if e["name"] in ("unmap", "map") and not (e["args"].get("tag") and e["args"]["bytes"]):
            fail("%s span without tag and bytes: %r" % (e["name"], e))

    # Counters: the last mapped bytes per tag match where the demo ends (trainer phase).
    last = {}
    for e in sorted(counters, key=lambda e: e["ts"]):
        last[e["name"]] = e["args"]["bytes"]
    for tag in ("engine_weights", "kv_cache"):
        if last.get("mapped_bytes " + tag) != 0:
            fail("mapped_bytes %s ends at %r" % (tag, last.get("mapped_bytes " + tag)))
    for tag in ("trainer_weights", "optimizer"):
        if not last.get("mapped_bytes " + tag):
            fail("mapped_bytes %s ends at %r" % (tag, last.get("mapped_bytes " + tag)))
    if last.get("host_pinned_bytes") != int(logged[-1][1]["host_pinned"]):
        fail("host_pinned_bytes ends at %r, the log at %s" %
             (last.get("host_pinned_bytes"), logged[-1][1]["host_pinned"]))
    pinned = sum(e["args"]["bytes"] for e in spans if e["name"] == "pin")
    if pinned != last["host_pinned_bytes"]:
        fail("pin spans add up to %d, the counter says %d" % (pinned, last["host_pinned_bytes"]))
    if "device_free_bytes 0" not in last:
        fail("no device_free_bytes counter")

    # TAGMEM_LOG=debug adds the driver calls.
    _, stderr = run(demo, 1, {"TAGMEM_LOG": "debug"})
    for call in ("cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync"):
        if not re.search(STAMP + r"driver %s\(.*\) = 0 [0-9.]+ us$" % call, stderr, re.M):
            fail("no debug line for %s" % call)
    print("check_trace: OK: %d switches, %d copies, %d counters" %
          (len(switches), len(copies), len(counters)))


if __name__ == "__main__":
    main()
