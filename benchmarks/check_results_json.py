#!/usr/bin/env python3
"""Runs a scenario runner with --tsv and checks the JSON written beside the TSV: Google
Benchmark's shape (context, benchmarks with name/run_type/iterations) and the same rows.

  check_results_json.py PROGRAM [ARGS...]
"""
import csv
import json
import os
import subprocess
import sys
import tempfile


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tsv = os.path.join(tmp, "results.tsv")
        subprocess.run(sys.argv[1:] + ["--tsv=" + tsv], check=True, stdout=subprocess.DEVNULL)
        with open(tsv, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        with open(os.path.join(tmp, "results.json")) as f:
            data = json.load(f)
    assert data["context"]["library"] == "tagmem", data["context"]
    bench = data["benchmarks"]
    assert rows and len(bench) == len(rows), (len(bench), len(rows))
    for row, b in zip(rows, bench):
        assert b["name"] == row["scenario"] + "/" + row["metric"], (b, row)
        assert b["run_type"] == "iteration" and b["iterations"] == 1, b
        assert (b["scenario"], b["metric"], b["label"]) == (row["scenario"], row["metric"], row["note"])
        if isinstance(b["value"], str):
            assert b["value"] == row["value"], (b, row)
        else:
            assert b["value"] == float(row["value"]), (b, row)
    print("check_results_json: OK: %d rows" % len(rows))


if __name__ == "__main__":
    main()
