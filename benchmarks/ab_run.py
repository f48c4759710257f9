#!/usr/bin/env python3
"""Two builds of a scenario runner alternated in one lease, A B A B ..., each with the same
arguments; then every metric of every run side by side. A change and its baseline so measure on
the same machine in the same boot, each round meeting the same conditions.

  python3 benchmarks/ab_run.py [--rounds N] [--until-seconds S] [--out DIR] A B -- ARGS...

A and B are runner binaries that take --tsv (tagmem_bench_offload of two commits; the baseline
built from a worktree: `git worktree add /tmp/base COMMIT`, then `cmake -S /tmp/base -B
/tmp/base/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo` and `cmake --build /tmp/base/build
--target tagmem_bench_offload`). Each run's output and TSV go to DIR (default: a new temporary
directory) as A-1.log, A-1.tsv, B-1.log, ...; the table goes to standard output, one row per
scenario and metric, one column per run, in the order they ran. --rounds runs that many A-B pairs
(default 2); --until-seconds starts no round after that many seconds (the first always runs).
Exits 1 if any run failed (its cells then read "failed").
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time


def run(binary, args, out, name):
    tsv = os.path.join(out, name + ".tsv")
    with open(os.path.join(out, name + ".log"), "w") as log:
        rc = subprocess.run([binary] + args + ["--tsv=" + tsv], stdout=log,
                            stderr=subprocess.STDOUT).returncode
    rows = {}
    if rc == 0 and os.path.exists(tsv):
        with open(tsv, newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                rows[(row["scenario"], row["metric"])] = row["value"]
    return rc, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--until-seconds", type=float, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- and the runner's arguments")
    opt = ap.parse_args(argv)
    args = opt.args[1:] if opt.args[:1] == ["--"] else opt.args
    if opt.rounds < 1:
        ap.error("--rounds: at least 1")
    out = opt.out or tempfile.mkdtemp(prefix="ab_run-")
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    runs, failed = [], False
    for i in range(1, opt.rounds + 1):
        if i > 1 and opt.until_seconds is not None and time.monotonic() - start > opt.until_seconds:
            break
        for side, binary in (("A", opt.a), ("B", opt.b)):
            name = f"{side}-{i}"
            t0 = time.monotonic()
            rc, rows = run(binary, args, out, name)
            failed = failed or rc != 0
            print(f"[ab_run] {name}: exit status {rc}, {time.monotonic() - t0:.0f} s", flush=True)
            runs.append((name, rc, rows))
    keys = []
    for _, _, rows in runs:
        keys += [k for k in rows if k not in keys]
    print(f"\nA = {opt.a}\nB = {opt.b}\nruns in {out}\n")
    print("| scenario | metric | " + " | ".join(name for name, _, _ in runs) + " |")
    print("|---|---|" + "---|" * len(runs))
    for key in keys:
        cells = [rows.get(key, "failed" if rc else "") for _, rc, rows in runs]
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
