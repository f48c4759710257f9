#!/usr/bin/env python3
"""A phase switch between two processes of one GPU, from their TAGMEM_TRACE files, as text.

  switch_rates.py TRACE.json TRACE.json ... [--bin-ms 20] [--spans-ms 0.5]

Each process writes its own trace (TAGMEM_TRACE=/tmp/t-%p.json); their times are the machine's
monotonic clock, so the files line up. A switch is one process's reload with the other processes'
offloads since their own last reload: for each, the calls, then the copy rate of every process and
direction in bins of --bin-ms until the last of their copies (an offload that returned early copies
after its call), in GB/s: a piece's bytes are spread over its span, which starts when the piece
could start, so a piece that waited for the copy engine is spread over its wait; then the bytes
each moved, and the host-side spans longer than --spans-ms, in time order with the changes of the
reloads' waiting states (a copy mark held, waiting for memory or for handles, copies giving way). A
process is named by its pid and the tags it copied. docs/observe.md describes the trace.
"""
import argparse
import collections
import json
import sys


# Counters that say what a reload waits for or holds back (docs/observe.md): printed where they
# change, since a release beside the copies or a wait shows in them first.
STATES = ("copy_mark", "peer_wait", "handle_wait", "copies giving way")


def load(paths):
    """(spans, counters): the "X" and "C" events of every file, each file read once."""
    spans, counters = [], []
    for path in paths:
        with open(path) as f:
            for e in json.load(f)["traceEvents"]:
                if e.get("ph") == "X":
                    spans.append(e)
                elif e.get("ph") == "C":
                    counters.append(e)
    return spans, counters


def state_changes(counters, lo, hi):
    """[(ts, pid, name, value)] of the STATES counters over [lo, hi), in time order."""
    return sorted((e["ts"], e["pid"], e["name"], int(next(iter(e["args"].values()), 0)))
                  for e in counters if e["name"] in STATES and lo <= e["ts"] < hi)


def process_names(spans):
    tags = collections.defaultdict(set)
    for e in spans:
        if e.get("cat") == "copy":
            tags[e["pid"]].add(e["args"].get("tag", "?"))
    return {pid: "%d (%s)" % (pid, ", ".join(sorted(t))) for pid, t in tags.items()}


def switches(spans):
    """[(reload span, [offload spans])], in time order."""
    calls = sorted((e for e in spans if e["name"] in ("offload", "reload")), key=lambda e: e["ts"])
    found = []
    for r in (c for c in calls if c["name"] == "reload"):
        outs = []
        for pid in {c["pid"] for c in calls if c["pid"] != r["pid"]}:
            before = [c for c in calls
                      if c["pid"] == pid and c["name"] == "reload" and c["ts"] < r["ts"]]
            since = before[-1]["ts"] + before[-1]["dur"] if before else float("-inf")
            outs += [c for c in calls if c["pid"] == pid and c["name"] == "offload" and
                     since < c["ts"] < r["ts"] + r["dur"]]
        if outs:
            found.append((r, sorted(outs, key=lambda c: c["ts"])))
    return found


def rates(spans, lo, hi, bin_us):
    """{(pid, direction): [bytes per bin]} over [lo, hi), and {(pid, direction): bytes}."""
    n = max(1, int((hi - lo) // bin_us) + 1)
    per_bin = collections.defaultdict(lambda: [0.0] * n)
    moved = collections.Counter()
    for e in spans:
        if e.get("cat") != "copy":
            continue
        s, d = e["ts"], max(e["dur"], 1e-3)
        if s + d <= lo or s >= hi:
            continue
        key = (e["pid"], e["name"].split()[-1])
        b = e["args"].get("bytes", 0)
        first, last = max(0, int((s - lo) // bin_us)), min(n - 1, int((s + d - lo) // bin_us))
        for k in range(first, last + 1):
            # Offsets into the span, not absolute times: a span of a few nanoseconds at a
            # timestamp of 10^10 microseconds would otherwise gain or lose bytes to rounding.
            x0 = max(0.0, (lo - s) + k * bin_us)
            x1 = min(d, (lo - s) + (k + 1) * bin_us, hi - s)
            if x1 > x0:
                per_bin[key][k] += b * (x1 - x0) / d
                moved[key] += b * (x1 - x0) / d
    return per_bin, moved


def window(spans, r, outs):
    """(lo, hi): from the switch's first call to the end of its last call or of its processes'
    last copy begun before then (an offload that returned early, TAGMEM_OFFLOAD_RETURN=queued,
    copies after its call)."""
    lo = min([r["ts"]] + [c["ts"] for c in outs])
    hi = max([r["ts"] + r["dur"]] + [c["ts"] + c["dur"] for c in outs])
    pids = {r["pid"]} | {c["pid"] for c in outs}
    return lo, max([hi] + [e["ts"] + e["dur"] for e in spans
                           if e.get("cat") == "copy" and e["pid"] in pids and lo <= e["ts"] < hi])


def report(spans, bin_ms, spans_ms, out, counters=()):
    names = process_names(spans)
    bin_us = bin_ms * 1e3
    for r, outs in switches(spans):
        lo, hi = window(spans, r, outs)
        out.write("\nswitch into %s: %.1f ms from the first call to the reload's end\n" %
                  (names.get(r["pid"], r["pid"]), (r["ts"] + r["dur"] - lo) / 1e3))
        for c in outs + [r]:
            start, end = (c["ts"] - lo) / 1e3, (c["ts"] + c["dur"] - lo) / 1e3
            out.write("  %-7s %s: %.1f .. %.1f ms\n" %
                      (c["name"], names.get(c["pid"], c["pid"]), start, end))
        per_bin, moved = rates(spans, lo, hi, bin_us)
        keys = sorted(per_bin)
        out.write("  %8s %s  all (GB/s)\n" % ("ms", " ".join("%14s" % ("%d %s" % k) for k in keys)))
        for i in range(len(per_bin[keys[0]]) if keys else 0):
            vals = [per_bin[k][i] / bin_us / 1e3 for k in keys]
            row = " ".join("%14.1f" % v for v in vals)
            out.write("  %8.0f %s %6.1f\n" % (i * bin_ms, row, sum(vals)))
        for k in keys:
            out.write("  moved %d %s: %.3f GB\n" % (k[0], k[1], moved[k] / 1e9))
        lines = [(e["ts"], "  span %d %-12s at %9.2f ms, %8.2f ms %s\n" % (
            e["pid"], e["name"], (e["ts"] - lo) / 1e3, e["dur"] / 1e3,
            (e.get("args") or {}).get("tag", "")))
            for e in spans if e.get("cat") != "copy" and e["name"] not in ("offload", "reload")
            and lo <= e["ts"] < hi and e["dur"] >= spans_ms * 1e3]
        lines += [(ts, "  state %d %-12s at %9.2f ms  -> %d\n" % (pid, name, (ts - lo) / 1e3, v))
                  for ts, pid, name, v in state_changes(counters, lo, hi)]
        for _, line in sorted(lines, key=lambda x: x[0]):
            out.write(line)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--bin-ms", type=float, default=20.0)
    p.add_argument("--spans-ms", type=float, default=0.5)
    a = p.parse_args()
    spans, counters = load(a.traces)
    report(spans, a.bin_ms, a.spans_ms, sys.stdout, counters)


if __name__ == "__main__":
    main()
