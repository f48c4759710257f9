#!/usr/bin/env python3
"""Checks ab_run.py with a scenario runner: two rounds of the runner against itself give a table
whose every cell is the value in that run's TSV, in the order the runs went; a side that fails
makes the exit status 1 and its cells read "failed".

  check_ab_run.py PROGRAM [ARGS...]
"""
import csv
import os
import subprocess
import sys
import tempfile

AB_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab_run.py")


def table(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    return head, rows


def ab_run(a, b, rounds, out, args):
    return subprocess.run([sys.executable, AB_RUN, "--rounds", str(rounds), "--out", out, a, b,
                           "--"] + args, capture_output=True, text=True)


def main():
    program, args = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as out:
        p = ab_run(program, program, 2, out, args)
        assert p.returncode == 0, p.stdout + p.stderr
        head, rows = table(p.stdout)
        assert head == ["scenario", "metric", "A-1", "B-1", "A-2", "B-2"], head
        assert rows, p.stdout
        for i, name in enumerate(head[2:]):
            with open(os.path.join(out, name + ".tsv"), newline="") as f:
                tsv = {(r["scenario"], r["metric"]): r["value"]
                       for r in csv.DictReader(f, delimiter="\t")}
            assert len(tsv) == len(rows), (name, len(tsv), len(rows))
            for row in rows:
                assert tsv[(row[0], row[1])] == row[2 + i], (name, row)
    with tempfile.TemporaryDirectory() as out:
        p = ab_run(program, "false", 1, out, args)
        assert p.returncode == 1, p.stdout + p.stderr
        head, rows = table(p.stdout)
        assert head[2:] == ["A-1", "B-1"], head
        assert rows and all(r[3] == "failed" and r[2] not in ("", "failed") for r in rows), rows
    print(f"ab_run.py: {len(head)} columns checked against the runs' TSV files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
