"""RL phase switch in PyTorch with the trainer and the engine in two processes on one GPU.

The C benchmark's rl_two_process scenario through the torch_memory_saver API and PyTorch tensors:
the trainer holds weights and optimizer state (backed up), the engine its own weights (backed up)
and a kv cache (discarded). A cycle is engine pause, trainer resume, trainer pause, engine resume,
as the C benchmark calls them: a pause or a resume takes every tag of its side in one call, except
that where the two sides' copies do not overlap the engine resumes its weights and then its kv
cache, timed alone (what a rollout engine waits for before it can take requests). A switch runs
from the start of the outgoing pause to the end of the incoming resume (one monotonic clock for
both processes). Methods, each pair of processes fresh:

- ``tagmem``: tagmem's torch_memory_saver drop-in, memory back with the driver between the sides;
- ``tagmem_handoff``: the same with TAGMEM_HANDOFF=on and one TAGMEM_JOB for both processes;
- ``tagmem_overlap``: handoff, the pause and the resume called at once;
- ``tagmem_early``: handoff, TAGMEM_OFFLOAD_RETURN=queued, the calls one after the other (the
  pause's copies give way to the other side's reload);
- ``tagmem_early_shared``: the same with TAGMEM_HANDOFF_GIVE_WAY=off (both share the link);
- ``tms_retain``: torch_memory_saver itself (retain_cpu_backup), when it imports.

Two shapes, as the C benchmark's: ``roomy``, a kv cache of ``--kv-gib`` (both sides fit at once on a
141 GiB H200, not on an 80 GB card), and ``tight``, where the engine sizes its kv cache to leave
under 2 GiB of the device free with the engine resident, as an engine that fills the device does
(vLLM's ``gpu_memory_utilization``), so that neither side can reload before the other gives memory
back. ``--step-ms`` waits between switches, as a training step and a rollout separate them in an RL
loop (default 0: back to back).

Each switch is set beside the overlapped limit of this run (the larger direction at the rate of
both directions at once): each pair's trainer measures the link with two streams, and the limits
take each rate's fastest reading of the run. After cycle 1 and the last,
each side checks its backed-up tensors against fingerprints taken before the first.

    python3 integrations/torch/bench/rl_two.py                       # all methods, 8B shapes
    python3 integrations/torch/bench/rl_two.py --shapes tight,roomy --step-ms 500 --cycles 3
    python3 integrations/torch/bench/rl_two.py --layers 2 --scale 8 --kv-gib 1 --cycles 3
"""

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_cycle import add_workload_args  # noqa: E402  (this directory, not a package)

GB = 1e9
GIB = 1 << 30
SHAPES = ("roomy", "tight")
TIGHT_FREE = int(1.5 * GIB)  # what a tight engine leaves free: under the 2 GiB the shape promises
METHODS = ("tagmem", "tagmem_handoff", "tagmem_overlap", "tagmem_early", "tagmem_early_shared",
           "tms_retain")
EARLY = ("tagmem_early", "tagmem_early_shared")  # TAGMEM_OFFLOAD_RETURN=queued
OVERLAPPING = ("tagmem_overlap",) + EARLY  # the two sides' copies run at the same time


def link_rates(torch, nbytes):
    """GB/s host to device, device to host, and both at once on two streams (medians of 5)."""
    hosts = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    devs = [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]

    def rate(copies, moved):
        times = []
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for stream, copy in zip(streams, copies):
                with torch.cuda.stream(stream):
                    copy()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return moved / statistics.median(times[1:]) / GB

    h2d = rate([lambda: devs[0].copy_(hosts[0], non_blocking=True)], nbytes)
    d2h = rate([lambda: hosts[1].copy_(devs[1], non_blocking=True)], nbytes)
    both = rate([lambda: devs[0].copy_(hosts[0], non_blocking=True),
                 lambda: hosts[1].copy_(devs[1], non_blocking=True)], 2 * nbytes)
    hosts.clear()
    devs.clear()
    torch.cuda.empty_cache()  # the buffers' device memory back with the driver
    return h2d, d2h, both


def child(args):
    """One side: reads commands on stdin, answers one line each on stdout."""
    import torch

    from workload import llama8b_shapes, make_parameters
    from rl_cycle import fingerprint, saver_for

    saver = saver_for("tms_retain" if args.method == "tms_retain" else "tagmem", args.tms_hook_mode)
    shapes = llama8b_shapes(args.layers, args.scale)
    backed, discarded = [], []
    if args.role == "trainer":
        with saver.region("trainer_weights", enable_cpu_backup=True):
            weights = make_parameters(shapes, seed=0)
        with saver.region("trainer_optim", enable_cpu_backup=True):
            optim = make_parameters(shapes, seed=1)
        tensors = weights + optim
        backed = ["trainer_weights", "trainer_optim"]
    else:
        with saver.region("engine_weights", enable_cpu_backup=True):
            tensors = make_parameters(shapes, seed=2)
        kv_bytes = args.kv_gib * GIB
        if args.shape == "tight":  # fill the device but TIGHT_FREE, as an engine sized to it does
            torch.cuda.synchronize()
            kv_bytes = torch.cuda.mem_get_info()[0] - TIGHT_FREE
        per = int(kv_bytes / 32) // (2 << 20) * (2 << 20)  # whole 2 MiB pages: no slack mapped
        if per <= 0:
            answer("fail no room for a kv cache")
            return 1
        with saver.region("engine_kv", enable_cpu_backup=False):
            kv = [torch.empty(per // 2, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
        backed, discarded = ["engine_weights"], ["engine_kv"]
    torch.cuda.synchronize()
    before = fingerprint(torch, tensors)

    def answer(line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def timed(fn, after=True):
        torch.cuda.synchronize()
        t0 = time.monotonic_ns()
        fn()
        if after:
            torch.cuda.synchronize()
        return f"ok {t0} {time.monotonic_ns()}"

    def pause():
        # Every tag of the side in one call, as a trainer under slime pauses: the drop-in offloads
        # the kv cache first (nothing to copy, its memory free at once), then the backed-up tags
        # together (Note [drop before copying]).
        saver.pause()

    kv_ns = [0]  # the last resume's kv cache alone (the engine's), reported after its switch

    def resume():
        # Every tag in one call, but for an engine whose side waits for nothing (the methods that
        # switch one side after the other): it resumes its kv cache in a call of its own, timed
        # apart, as the C benchmark's handoff variant does.
        if not discarded or args.method in OVERLAPPING:
            saver.resume()
            return
        for tag in backed:  # the weights first: their copies start at once
            saver.resume(tag)
        torch.cuda.synchronize()
        t0 = time.monotonic_ns()
        for tag in discarded:
            saver.resume(tag)
        torch.cuda.synchronize()
        kv_ns[0] = time.monotonic_ns() - t0

    if args.role == "trainer":  # the link, and the bytes the trainer backs up
        rates = link_rates(torch, int(args.link_gib * (1 << 30)))
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        answer("ready " + " ".join(f"{x:.3f}" for x in rates) + f" {nbytes}")
    else:
        answer(f"ready {32 * per}")
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "pause":
                # No device-wide wait after it: an offload that returned early (TAGMEM_OFFLOAD_RETURN
                # =queued) still copies on tagmem's streams, which torch.cuda.synchronize() waits for.
                # Each method's pause returns with its own work done (a queued one, with its copies
                # queued), as the C bench's does.
                answer(timed(pause, after=False))
            elif cmd == "resume":
                answer(timed(resume) + f" {kv_ns[0]}")
            elif cmd == "settle":  # a queued pause's copies done, its memory back with the driver
                torch.cuda.synchronize()
                if args.method != "tms_retain":
                    import tagmem

                    tagmem.wait_released()
                answer("ok")
            elif cmd == "verify":
                after = fingerprint(torch, tensors)
                same = all(a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
                           for a, b in zip(before, after))
                if args.role == "engine":
                    for i, t in enumerate(kv):
                        t.fill_(float(i))
                    same = same and all(float(t[-1]) == float(i) for i, t in enumerate(kv))
                answer("ok" if same else "fail bytes differ")
            elif cmd == "quit":
                break
            else:
                answer("fail unknown command " + cmd)
        except Exception as e:  # the driving process reports it
            answer(f"fail {type(e).__name__}: {e}")
    return 0  # an offload that returned early finishes at exit (Note [early return])


class Side:
    def __init__(self, role, args, env):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", role, "--method", args.method,
               "--layers", str(args.layers), "--scale", str(args.scale), "--kv-gib",
               str(args.kv_gib), "--link-gib", str(args.link_gib), "--shape", args.shape]
        if args.tms_hook_mode:
            cmd += ["--tms-hook-mode", args.tms_hook_mode]
        self.role = role
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, bufsize=1)
        self.ready = self.read("start")

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def read(self, what):
        while True:  # anything else the child prints goes to stderr
            line = self.p.stdout.readline()
            if not line or line.startswith(("ok", "ready", "fail")):
                break
            sys.stderr.write(f"[{self.role}] {line}")
        line = line.strip()
        if not line.startswith(("ok", "ready")):
            raise RuntimeError(f"{self.role} '{what}': {line or 'died'}")
        return line.split()[1:]

    def ask(self, cmd):
        self.send(cmd)
        return self.read(cmd)

    def close(self):
        try:
            self.send("quit")
        except OSError:
            pass
        return self.p.wait(timeout=120)


def run_method(args, method, shape):
    env = dict(os.environ)
    for k in ("TAGMEM_HANDOFF", "TAGMEM_OFFLOAD_RETURN", "TAGMEM_HANDOFF_GIVE_WAY"):
        env.pop(k, None)
    if method in ("tagmem_handoff", "tagmem_overlap") + EARLY:
        env["TAGMEM_HANDOFF"] = "on"
        env["TAGMEM_JOB"] = f"rl-two-{uuid.uuid4().hex}"
        env.setdefault("TAGMEM_PEER_DIR", tempfile.mkdtemp(prefix="tagmem-rl-two-"))
    if method in EARLY:
        env["TAGMEM_OFFLOAD_RETURN"] = "queued"
    if method == "tagmem_early_shared":
        env["TAGMEM_HANDOFF_GIVE_WAY"] = "off"
    if method == "tms_retain":
        env["TMS_RETAIN_CPU_BACKUP"] = "1"
    a = argparse.Namespace(**vars(args))
    a.method = method
    a.shape = shape
    at_once = method == "tagmem_overlap"
    trainer = Side("trainer", a, env)
    h2d, d2h, both, trainer_bytes = (float(x) for x in trainer.ready)
    trainer.ask("pause")  # so that the engine fits
    trainer.ask("settle")  # and a tight engine sizes its kv cache to the device without it
    engine = Side("engine", a, env)
    kv_bytes = int(engine.ready[0])
    to_trainer, to_engine, kv_resume = [], [], []

    def switch(out, inn):
        if at_once:
            out.send("pause")
            inn.send("resume")
            p, r = out.read("pause"), inn.read("resume")
        else:
            p, r = out.ask("pause"), inn.ask("resume")
        if inn is engine:
            kv_resume.append(int(r[2]) / 1e9)
        return (int(r[1]) - min(int(p[0]), int(r[0]))) / 1e9

    def step():
        time.sleep(args.step_ms / 1e3)

    try:
        for c in range(args.cycles):
            check = c == 0 or c == args.cycles - 1
            to_trainer.append(switch(engine, trainer))
            if check:
                trainer.ask("verify")
            step()
            to_engine.append(switch(trainer, engine))
            if check:
                engine.ask("verify")
            step()
            print(f"[{method}, {shape}] cycle {c + 1}: switch to trainer "
                  f"{to_trainer[-1] * 1e3:.1f} ms, to engine {to_engine[-1] * 1e3:.1f} ms", flush=True)
    finally:
        rc = (engine.close(), trainer.close())
    return {"method": method, "shape": shape, "kv_bytes": kv_bytes, "to_trainer": to_trainer,
            "to_engine": to_engine, "kv_resume": kv_resume, "link": (h2d, d2h, both), "trainer_bytes": trainer_bytes,
            "exit": rc}


def limits(trainer_bytes, link):
    """Overlapped limits (s) into the trainer and into the engine: the larger direction at its own
    rate, or both directions' bytes at the rate of both at once, whichever is longer. The engine's
    weights have the trainer's shapes (half its bytes); its kv cache has nothing to copy."""
    weights = trainer_bytes / 2
    h2d, d2h, both = (x * GB for x in link)

    def limit(b_in, b_out):
        return max(b_in / h2d, b_out / d2h, (b_in + b_out) / both)

    return limit(2 * weights, weights), limit(weights, 2 * weights)


def row(r, link):
    """A method's row of the table: its switches beside the limits from the run's `link`."""
    lt, le = limits(r["trainer_bytes"], link)
    cells = []
    for sw, lim in ((r["to_trainer"], lt), (r["to_engine"], le)):
        steady = statistics.median(sw[1:] or sw)
        cells.append(f"{sw[0] * 1e3:.1f} / {steady * 1e3:.1f} ms ({steady / lim:.3f} x "
                     f"limit {lim * 1e3:.0f} ms)")
    kv = r["kv_resume"]
    if r["method"] in OVERLAPPING:
        cells.append("(in the engine's resume)")
    else:
        cells.append(f"{kv[0] * 1e3:.2f} / {statistics.median(kv[1:] or kv) * 1e3:.2f} ms")
    h2d, d2h, both = r["link"]
    return (f"| {r['method']} | {r['shape']}, kv {r['kv_bytes'] / GIB:.1f} GiB "
            f"| {' | '.join(cells)} | {h2d:.1f} / {d2h:.1f} / {both:.1f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", "--methods", dest="method", default="all",
                    help=f"all, or a comma-separated list of {', '.join(METHODS)} (default: all)")
    add_workload_args(ap)
    ap.add_argument("--shapes", default="roomy",
                    help=f"a comma-separated list of {', '.join(SHAPES)} (default: roomy)")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="wait this long between switches (default 0: back to back)")
    ap.add_argument("--child", choices=("trainer", "engine"), help=argparse.SUPPRESS)
    ap.add_argument("--shape", choices=SHAPES, default="roomy", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.role = args.child
        return child(args)
    methods = METHODS if args.method == "all" else tuple(args.method.split(","))
    shapes = tuple(args.shapes.split(","))
    for name, given, known in (("method", methods, METHODS), ("shape", shapes, SHAPES)):
        if not set(given) <= set(known):
            ap.error(f"--{name}: one of {', '.join(known)} expected, not {','.join(given)}")
    rows, failed = [], False
    for shape in shapes:
        for m in methods:
            if m == "tms_retain" and importlib.util.find_spec("torch_memory_saver") is None:
                rows.append(f"| {m} | {shape} | skipped: torch_memory_saver is not importable "
                            "| | | |")
                continue
            try:
                r = run_method(args, m, shape)
            except Exception as e:
                print(f"[{m}, {shape}] ERROR: {e}", flush=True)
                rows.append(f"| {m} | {shape} | ERROR: {e} | | | |")
                failed = failed or m.startswith("tagmem")
                continue
            rows.append(r)  # its row once the run's link is known
    # Every pair measures the same link, and a link does not get faster than it is: a reading
    # below the others was disturbed, so the limits take each rate's fastest reading of the run
    # (each pair's own stays in the last column).
    results = [r for r in rows if not isinstance(r, str)]
    link = tuple(max(r["link"][i] for r in results) for i in range(3)) if results else None
    rows = [r if isinstance(r, str) else row(r, link) for r in rows]
    print()
    print(f"step between switches: {args.step_ms:g} ms")
    if link:
        print(f"limits from the run's link: {link[0]:.1f} GB/s host to device, {link[1]:.1f} "
              f"device to host, {link[2]:.1f} both ways (the fastest of {len(results)} pairs' "
              "readings)")
    print("| method | shape | switch to trainer c1 / steady | switch to engine c1 / steady "
          "| engine kv resume c1 / steady | the pair's link H2D / D2H / both GB/s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
