"""integrations/torch/bench/rl_two.py's table, torch-free: the limits come from the run's link.

Each pair of processes measures the link in its trainer, and one reading can come out well below
the others; a switch set beside a limit computed from that reading looks faster than the link
allows. The pairs are stood in for (no processes, no device) with random switch times and link
readings, one of them disturbed, and every row's limits must be those of each rate's fastest
reading of the run.
"""

import os
import sys

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "integrations", "torch", "bench")
sys.path.insert(0, _BENCH)
import rl_two  # noqa: E402  (a script's directory, not a package)


def test_every_row_is_set_beside_the_runs_fastest_link_readings(rng, monkeypatch, capsys):
    methods = ("tagmem_overlap", "tagmem_early", "tagmem_early_shared")
    readings = {}
    for m in methods:
        readings[m] = (rng.uniform(53.0, 55.5), rng.uniform(53.0, 55.5), rng.uniform(88.0, 101.0))
    disturbed = rng.choice(methods)
    readings[disturbed] = (rng.uniform(25.0, 35.0), readings[disturbed][1], rng.uniform(60.0, 80.0))
    trainer_bytes = rng.uniform(30e9, 34e9)

    def stand_in(args, method, shape):
        switch = [rng.uniform(0.55, 1.1) for _ in range(args.cycles)]
        return {"method": method, "shape": shape, "kv_bytes": 60 << 30, "to_trainer": switch,
                "to_engine": list(reversed(switch)), "kv_resume": [0.002] * args.cycles,
                "link": readings[method], "trainer_bytes": trainer_bytes, "exit": (0, 0)}

    monkeypatch.setattr(rl_two, "run_method", stand_in)
    assert rl_two.main(["--methods", ",".join(methods), "--shapes", "tight", "--cycles", "3"]) == 0
    out = capsys.readouterr().out
    best = tuple(max(r[i] for r in readings.values()) for i in range(3))
    into_trainer, into_engine = rl_two.limits(trainer_bytes, best)
    rows = [line for line in out.splitlines() if line.startswith("| tagmem")]
    assert len(rows) == len(methods)
    for line in rows:
        assert f"limit {into_trainer * 1e3:.0f} ms" in line.split(" | ")[2], line
        assert f"limit {into_engine * 1e3:.0f} ms" in line.split(" | ")[3], line
    assert f"{best[0]:.1f} GB/s host to device" in out
    # The disturbed pair's own reading stays in its row, for whoever reads the table.
    row = next(line for line in rows if line.startswith(f"| {disturbed} |"))
    assert row.endswith(f"| {readings[disturbed][0]:.1f} / {readings[disturbed][1]:.1f} / "
                        f"{readings[disturbed][2]:.1f} |")
