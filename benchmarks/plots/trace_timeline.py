#!/usr/bin/env python3
"""Pictures from a TAGMEM_TRACE file: one phase switch as a timeline, and memory over the run.

  trace_timeline.py TRACE.json [--out DIR] [--switch KIND] [--index N]

Writes DIR/phase_switch.png: the chosen switch (default: the last swap, a steady-state one) with a
row per copy stream (each piece a bar, coloured by tag, GB/s per direction in the title) and rows
for the host-side work (planning, unmaps, maps, pinning, the release thread); and DIR/memory.png:
device memory mapped per tag (stacked) and pinned host memory over the whole trace, switches
shaded. Needs matplotlib (Debian: python3-matplotlib). docs/observe.md describes the trace.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SWITCHES = ("offload", "reload", "swap")
HOST_ROWS = ("trace clock", "plan", "pin", "unmap", "map", "release")
GiB = float(1 << 30)


def load(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    counters = [e for e in events if e.get("ph") == "C"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    return spans, counters, tracks


def pick_switch(spans, kind, index):
    found = sorted((e for e in spans if e["name"] in SWITCHES and (not kind or e["name"] == kind)),
                   key=lambda e: e["ts"])
    if not found:
        sys.exit("trace_timeline: no %s span in the trace" % (kind or "phase switch"))
    return found[index]


def colours(tags):
    cmap = plt.get_cmap("tab10")
    return {t: cmap(i % 10) for i, t in enumerate(sorted(tags))}


def timeline(spans, tracks, sw, out):
    t0, t1 = sw["ts"], sw["ts"] + sw["dur"]
    inside = [e for e in spans if e["ts"] >= t0 - 1 and e["ts"] + e["dur"] <= t1 + 1 and e is not sw]
    # The release thread works after a swap returns: show what overlaps the switch, or just follows.
    later = [e for e in spans if e["name"] == "release" and t0 <= e["ts"] <= t1 + sw["dur"]]
    inside += [e for e in later if e not in inside]
    copies = [e for e in inside if e["name"].startswith("copy ")]
    rows = sorted({tracks.get(e["tid"], str(e["tid"])) for e in copies})
    rows += [r for r in HOST_ROWS if any(e["name"] == r for e in inside)]
    tags = {e["args"].get("tag") for e in inside if e["args"].get("tag")}
    colour = colours(tags)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * len(rows)))
    for e in inside:
        row = tracks.get(e["tid"], str(e["tid"])) if e["name"].startswith("copy ") else e["name"]
        if row not in rows:
            continue
        y = len(rows) - 1 - rows.index(row)
        c = colour.get(e["args"].get("tag"), "0.5")
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"], 1) / 1e3)], (y - 0.4, 0.8),
                       facecolors=c, edgecolors="black", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(reversed(rows)))
    ax.set_xlabel("ms since the %s began" % sw["name"])
    rates = []
    for direction in ("D2H", "H2D"):
        pieces = [e for e in copies if e["name"] == "copy " + direction]
        if pieces:
            start = min(e["ts"] for e in pieces)
            end = max(e["ts"] + e["dur"] for e in pieces)
            moved = sum(e["args"].get("bytes", 0) for e in pieces)
            rates.append("%s %.2f GiB at %.1f GB/s" % (direction, moved / GiB,
                                                        moved / 1e3 / max(end - start, 1e-3)))
    ax.set_title("%s: %.1f ms  %s" % (sw["name"], sw["dur"] / 1e3, "  ".join(rates)))
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[t]) for t in sorted(colour)]
    if handles:
        ax.legend(handles, sorted(colour), loc="upper right", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def series(counters, name):
    pts = sorted((e["ts"], e["args"]["bytes"]) for e in counters if e["name"] == name)
    return pts


def value_at(pts, t):
    v = 0
    for ts, x in pts:
        if ts > t:
            break
        v = x
    return v


def memory(spans, counters, out):
    names = sorted({e["name"] for e in counters if e["name"].startswith("mapped_bytes ")})
    times = sorted({e["ts"] for e in counters})
    if not times:
        sys.exit("trace_timeline: no counters in the trace")
    start = times[0]
    xs = [(t - start) / 1e6 for t in times]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    base = [0.0] * len(times)
    colour = colours([n.split(" ", 1)[1] for n in names])
    for n in names:
        pts = series(counters, n)
        ys = [b + value_at(pts, t) / GiB for b, t in zip(base, times)]
        tag = n.split(" ", 1)[1]
        top.fill_between(xs, base, ys, step="post", color=colour[tag], label=tag, alpha=0.8)
        base = ys
    top.set_ylabel("device memory mapped (GiB)")
    top.legend(loc="upper right", fontsize="small")
    for name, label in (("host_pinned_bytes", "host pinned"), ("host_used_bytes", "host used by backups")):
        pts = series(counters, name)
        if pts:
            bottom.step([(t - start) / 1e6 for t, _ in pts], [v / GiB for _, v in pts], where="post",
                        label=label)
    bottom.set_ylabel("host memory (GiB)")
    bottom.set_xlabel("seconds since the first counter")
    bottom.legend(loc="lower right", fontsize="small")
    for e in spans:
        if e["name"] in SWITCHES:
            for ax in (top, bottom):
                ax.axvspan((e["ts"] - start) / 1e6, (e["ts"] + e["dur"] - start) / 1e6,
                           color="0.85", zorder=0)
    top.set_title("memory over the run (grey: phase switches)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--out", default=".", help="directory for the PNGs")
    p.add_argument("--switch", default="swap", help="offload, reload, swap, or '' for any")
    p.add_argument("--index", type=int, default=-1, help="which of them (default: the last)")
    a = p.parse_args()
    spans, counters, tracks = load(a.trace)
    os.makedirs(a.out, exist_ok=True)
    timeline(spans, tracks, pick_switch(spans, a.switch, a.index),
             os.path.join(a.out, "phase_switch.png"))
    memory(spans, counters, os.path.join(a.out, "memory.png"))
    print("wrote %s and %s" % (os.path.join(a.out, "phase_switch.png"),
                               os.path.join(a.out, "memory.png")))


if __name__ == "__main__":
    main()
