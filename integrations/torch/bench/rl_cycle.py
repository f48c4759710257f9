"""RL phase-switch cycle in PyTorch: trainer weights + optimizer state (backed up) and the engine's
kv cache (discarded), paused and resumed through the torch_memory_saver API.

Every method runs in its own process (torch_memory_saver's "torch" hook mode has crashed at
interpreter exit after printing its figures), on the same workload:

- ``tagmem``: tagmem's torch_memory_saver compat layer (MemPool mode);
- ``tms_default`` / ``tms_retain``: torch_memory_saver itself, default and ``retain_cpu_backup``
  modes, when ``import torch_memory_saver`` works (otherwise they are skipped, and say so);
- ``vllm_sleep``: vLLM's sleep-mode allocator (``CuMemAllocator``), built from the vLLM source
  checkout given with --vllm-src (vllm_sleep_baseline.py; skipped without it). Its one
  ``sleep(offload_tags=("weights",))`` pauses weights and kv together; it then wakes the weights,
  then the kv cache.

A cycle, each step timed after ``torch.cuda.synchronize()``: pause weights (weights and optimizer
regions), pause kv (its memory back with the driver), resume kv, resume weights. Cycle 1 is
reported apart; steady is the median of cycles 2..N; "cycle" is the sum of a cycle's steps, the
figure that compares methods whose steps differ. The H2D and D2H link is measured in each
process with pinned tensor copies. After the last cycle every weights and optimizer tensor is
checked against a checksum and a window copied before the first cycle; the kv cache is written and
read back.

    python3 integrations/torch/bench/phase_switch.py --scenario rl_cycle            # all methods
    python3 integrations/torch/bench/phase_switch.py --scenario rl_cycle --methods tagmem,vllm_sleep \
        --vllm-src VLLM_CHECKOUT
    python3 integrations/torch/bench/rl_cycle.py --method tagmem --layers 2 --scale 8 --kv-gib 0.25
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GB = 1e9
METHODS = ("tagmem", "tms_default", "tms_retain", "vllm_sleep")
STEPS = ("pause_weights_s", "pause_kv_s", "resume_kv_s", "resume_weights_s")


def saver_for(method, hook_mode, vllm_src=None):
    if method == "vllm_sleep":
        from vllm_sleep_baseline import VllmSleepSaver, default_build_dir

        return VllmSleepSaver(vllm_src, default_build_dir())
    if method == "tagmem":
        from tagmem.compat.torch_memory_saver import torch_memory_saver as saver

        return saver
    if method == "tms_retain":
        os.environ["TMS_RETAIN_CPU_BACKUP"] = "1"
    from torch_memory_saver import torch_memory_saver as saver

    # Not hasattr(): torch_memory_saver's hook_mode getter raises, and its retain_cpu_backup
    # getter initialises the saver (in the default hook mode) before the mode is set.
    if hook_mode:
        try:
            saver.hook_mode = hook_mode
        except AttributeError:  # a version without the setting
            pass
    if method == "tms_retain":
        try:
            saver.retain_cpu_backup = True
        except AttributeError:  # a version that reads TMS_RETAIN_CPU_BACKUP only
            pass
    return saver


def measure_link(torch, nbytes):
    """Median GB/s of H2D and D2H copies of `nbytes` between a pinned tensor and the device."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def rate(copy):
        copy()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / GB

    h2d = rate(lambda: dev.copy_(host, non_blocking=True))
    d2h = rate(lambda: host.copy_(dev, non_blocking=True))
    del host, dev
    return h2d, d2h


def fingerprint(torch, tensors):
    """An exact sum and the first and last 64 KiB of every tensor (on the host)."""
    out = []
    for t in tensors:
        words = t.detach().reshape(-1).view(torch.int16)
        window = min(words.numel(), 32768)
        # Summed in chunks: one int64 copy of a whole large tensor would need four times its
        # bytes free, which a device filled by its kv cache does not have.
        total = sum(int(c.sum(dtype=torch.int64)) for c in words.split(1 << 24))
        out.append((total, words[:window].cpu(), words[-window:].cpu()))
    return out


def run_method(args):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from workload import llama8b_shapes, make_parameters

    saver = saver_for(args.method, args.tms_hook_mode, args.vllm_src)
    h2d, d2h = measure_link(torch, int(args.link_gib * (1 << 30)))
    shapes = llama8b_shapes(args.layers, args.scale)
    with saver.region("rl_weights", enable_cpu_backup=True):
        weights = make_parameters(shapes, seed=0)
    with saver.region("rl_optim", enable_cpu_backup=True):
        optim = make_parameters(shapes, seed=1)
    per = int(args.kv_gib * (1 << 30) / 32) // 2 * 2
    with saver.region("rl_kv", enable_cpu_backup=False):
        kv = [torch.empty(per // 2, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
    torch.cuda.synchronize()
    trainer_bytes = sum(p.numel() * 2 for p in weights + optim)
    before = fingerprint(torch, weights + optim)

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def pause_weights():
        saver.pause("rl_weights")
        saver.pause("rl_optim")

    def resume_weights():
        saver.resume("rl_weights")
        saver.resume("rl_optim")

    if hasattr(saver, "cycle_steps"):  # a saver whose cycle has other steps (vllm_sleep)
        steps = saver.cycle_steps()
    else:
        steps = [("pause_weights_s", pause_weights), ("pause_kv_s", lambda: saver.pause("rl_kv")),
                 ("resume_kv_s", lambda: saver.resume("rl_kv")), ("resume_weights_s", resume_weights)]
    cycles = []
    for c in range(args.cycles):
        row = {key: timed(step) for key, step in steps}
        for i, t in enumerate(kv):  # usable again: its contents are undefined after a pause
            t.fill_(float(i + c))
        if any(float(t[0]) != float(i + c) or float(t[-1]) != float(i + c) for i, t in enumerate(kv)):
            raise SystemExit(f"FAIL: kv cache not writable after cycle {c + 1}")
        cycles.append(row)
        print(f"[{args.method}] cycle {c + 1}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row.items()), flush=True)
    after = fingerprint(torch, weights + optim)
    for i, (a, b) in enumerate(zip(before, after)):
        if a[0] != b[0] or not torch.equal(a[1], b[1]) or not torch.equal(a[2], b[2]):
            raise SystemExit(f"FAIL: [{args.method}] tensor {i} changed after the cycles")
    return {
        "method": args.method,
        "link_h2d_GBps": h2d,
        "link_d2h_GBps": d2h,
        "trainer_bytes": trainer_bytes,
        "kv_bytes": per * 32,
        "verified": True,
        "cycles": cycles,
    }


def steady(r, key):
    """The median of `key` over cycles 2..N (cycle 1 when there is only one); None if no such step."""
    if key not in r["cycles"][0]:
        return None
    return statistics.median(c[key] for c in r["cycles"][1:] or r["cycles"])


def with_cycle(r):
    """`r` with each cycle's "cycle_s", the sum of its steps."""
    for c in r["cycles"]:
        c["cycle_s"] = sum(v for k, v in c.items() if k in STEPS)
    return r


def summary_rows(results):
    keys = STEPS + ("cycle_s",)
    lines = [
        "| method | " + " | ".join(f"{k[:-2].replace('_', ' ')} c1 / steady" for k in keys)
        + " | resume weights / link H2D | link H2D / D2H GB/s |",
        "|---|" + "---|" * (len(keys) + 2),
    ]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['method']} | skipped: {r['skipped']} |")
            continue
        cells = []
        for k in keys:
            if k not in r["cycles"][0]:
                cells.append("— (in pause weights)")
                continue
            cells.append(f"{r['cycles'][0][k] * 1e3:.1f} / {steady(r, k) * 1e3:.1f} ms")
        ratio = r["trainer_bytes"] / steady(r, "resume_weights_s") / GB / r["link_h2d_GBps"]
        lines.append(f"| {r['method']} | " + " | ".join(cells)
                     + f" | {ratio:.3f} | {r['link_h2d_GBps']:.1f} / {r['link_d2h_GBps']:.1f} |")
    return lines + ratio_rows(results)


def ratio_rows(results):
    """Each other method's figures divided by tagmem's (above 1: tagmem is faster)."""
    done = {r["method"]: r for r in results if "skipped" not in r}
    if "tagmem" not in done or len(done) < 2:
        return []

    def pause(r):  # both pauses: one step for a method that pauses weights and kv together
        return steady(r, "pause_weights_s") + (steady(r, "pause_kv_s") or 0.0)

    figures = (("pause (weights + kv) steady", pause),
               ("resume weights steady", lambda r: steady(r, "resume_weights_s")),
               ("resume kv steady", lambda r: steady(r, "resume_kv_s")),
               ("cycle steady", lambda r: steady(r, "cycle_s")), ("cycle 1", lambda r: r["cycles"][0]["cycle_s"]))
    base = done.pop("tagmem")
    lines = ["", "| method / tagmem | " + " | ".join(name for name, _ in figures) + " |",
             "|---|" + "---|" * len(figures)]
    for name, r in done.items():
        lines.append(f"| {name} | " + " | ".join(f"{f(r) / f(base):.2f}×" for _, f in figures) + " |")
    return lines


def run_all(args):
    """Each method in its own process; prints one table."""
    results = []
    for m in args.method:
        if m.startswith("tms") and importlib.util.find_spec("torch_memory_saver") is None:
            results.append({"method": m, "skipped": "import torch_memory_saver fails"})
            print(f"[{m}] skipped: torch_memory_saver is not importable", flush=True)
            continue
        if m == "vllm_sleep" and not args.vllm_src:
            results.append({"method": m, "skipped": "no --vllm-src"})
            print(f"[{m}] skipped: it needs a vLLM source checkout (--vllm-src)", flush=True)
            continue
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [sys.executable, os.path.abspath(__file__), "--method", m, "--child-json", out,
               "--layers", str(args.layers), "--scale", str(args.scale), "--kv-gib", str(args.kv_gib),
               "--cycles", str(args.cycles), "--link-gib", str(args.link_gib)]
        if args.tms_hook_mode:
            cmd += ["--tms-hook-mode", args.tms_hook_mode]
        if args.vllm_src:
            cmd += ["--vllm-src", args.vllm_src]
        rc = subprocess.run(cmd).returncode
        try:
            with open(out) as f:
                r = json.load(f)
            if rc != 0:  # the figures were written; the process failed afterwards (at exit)
                r["exit_code"] = rc
                print(f"[{m}] exited with {rc} after writing its results", flush=True)
            results.append(with_cycle(r))
        except (OSError, ValueError):
            results.append({"method": m, "skipped": f"failed (exit {rc}), no results"})
        finally:
            os.unlink(out)
    print()
    print("\n".join(summary_rows(results)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0 if all("skipped" not in r or r["method"] != "tagmem" for r in results) else 1


def method_list(text):
    """"all" or a comma-separated list of METHODS, in the order given."""
    names = list(METHODS) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: pick from {', '.join(METHODS)} or all")
    return names


def add_workload_args(ap):
    """The workload's arguments, shared with rl_two.py."""
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1, help="divide every width (quick runs)")
    ap.add_argument("--kv-gib", type=float, default=60.0)
    ap.add_argument("--link-gib", type=float, default=4.0)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--tms-hook-mode", default="torch", help="torch_memory_saver.hook_mode")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", "--methods", dest="method", type=method_list, default="all",
                    help=f"all, or a comma-separated list of {', '.join(METHODS)} (default: all)")
    add_workload_args(ap)
    ap.add_argument("--vllm-src", help="a vLLM source checkout, for vllm_sleep (vllm_sleep_baseline.py)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--child-json", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.child_json:
        (args.method,) = args.method
        result = run_method(args)
        with open(args.child_json, "w") as f:
            json.dump(result, f)
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
