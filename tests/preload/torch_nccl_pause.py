"""torch_nccl_pause.py — torch.distributed with NCCL under libtagmem_preload.so.

Started by torchrun (one process per GPU of a node). Every rank runs all_reduce (sum and max),
all_gather, reduce_scatter, broadcast and send/recv on random data drawn from a seed.

  --mode baseline  no shim: runs the collectives for seeds 0..cycles-1 and writes a digest of
                   every result (rank-<r>-digests.json) for the pause run to compare with.
  --mode pause     under the shim: after a warm-up measures the device memory NCCL holds here
                   (the shim's records, and the free-memory change around NCCL's start), then
                   runs `cycles` collective pause/resume cycles of the `nccl` tag. Each cycle
                   measures what the pause gave back (free device memory) and the time taken,
                   then runs the collectives with that cycle's seed; the results must be
                   bit-identical to the baseline run's, and (for the first seeds) to this
                   process's own results before any pause. Free memory after each cycle must
                   stay within 2 MiB of cycle 1.

Writes rank-<r>.json (metrics) into --out and exits non-zero on any failed check.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

MiB = 1 << 20


def collectives(seed, n, rank, world, dev):
    g = torch.Generator(device=dev)
    g.manual_seed(seed * 7919 + rank)
    x = torch.randn(n, generator=g, device=dev, dtype=torch.float32)
    xi = torch.randint(-(1 << 30), 1 << 30, (n,), generator=g, device=dev, dtype=torch.int64)
    xb = torch.randn(n, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
    outs = []
    a = x.clone()
    dist.all_reduce(a)
    outs.append(a)
    m = xi.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    outs.append(m)
    ab = xb.clone()
    dist.all_reduce(ab)
    outs.append(ab)
    ag = torch.empty(world * n, device=dev, dtype=x.dtype)
    dist.all_gather_into_tensor(ag, x)
    outs.append(ag)
    rs = torch.empty(n // world, device=dev, dtype=x.dtype)
    dist.reduce_scatter_tensor(rs, x)
    outs.append(rs)
    bc = x.clone()
    dist.broadcast(bc, src=seed % world)
    outs.append(bc)
    got = torch.empty_like(x)
    # Batched, as PyTorch recommends: unbatched isend/irecv on an eagerly initialised group
    # ended in an illegal address inside NCCL on the H200 pair (PyTorch 2.11, NCCL 2.28), with
    # and without the shim.
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    outs.append(got)
    torch.cuda.synchronize(dev)
    return [o.cpu() for o in outs]


def digest(outs):
    h = hashlib.sha256()
    for o in outs:
        h.update(o.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def identical(a, b):
    """Bit for bit (NaN payloads and signed zeros included)."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["baseline", "pause"], required=True)
    ap.add_argument("--elems", type=int, default=1 << 22)
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", help="directory of the baseline run's digests")
    ap.add_argument("--require-share", type=float, default=0.9,
                    help="minimum share of this GPU's NCCL memory a pause must give back (0: report only)")
    ap.add_argument("--timeout-ms", type=int, default=120000)
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    torch.empty(1, device=dev)
    torch.cuda.synchronize(dev)
    free0, total = torch.cuda.mem_get_info(dev)
    reserved0 = torch.cuda.memory_reserved(dev)

    dist.init_process_group("nccl", device_id=dev)
    n = args.elems - args.elems % world
    failures = []
    metrics = {"rank": rank, "mode": args.mode, "elems": n, "cycles": args.cycles,
               "nccl_cumem_enable": os.environ.get("NCCL_CUMEM_ENABLE", "(default)"),
               "total_bytes": total}

    # Warm-up: every collective at this size, so NCCL sets up every connection now.
    for s in range(2):
        collectives(10_000 + s, n, rank, world, dev)
    dist.barrier()
    torch.cuda.synchronize(dev)
    free1 = torch.cuda.mem_get_info(dev)[0]
    reserved1 = torch.cuda.memory_reserved(dev)
    metrics["nccl_estimate_bytes"] = (free0 - free1) - (reserved1 - reserved0)

    if args.mode == "baseline":
        metrics["digests"] = [digest(collectives(c, n, rank, world, dev)) for c in range(args.cycles)]
        with open(os.path.join(args.out, f"rank-{rank}-digests.json"), "w") as f:
            json.dump(metrics["digests"], f)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from tagmem_shim import Shim
        shim = Shim()
        group = None  # the shim's default: this torchrun job (TORCHELASTIC_RUN_ID), group "nccl"
        expected = None
        if args.baseline:
            with open(os.path.join(args.baseline, f"rank-{rank}-digests.json")) as f:
                expected = json.load(f)
        before_pause = {c: collectives(c, n, rank, world, dev) for c in range(min(3, args.cycles))}
        dist.barrier()
        torch.cuda.synchronize(dev)
        st = shim.nccl_stats()
        here = st["local_bytes"] + st["exported_bytes"]  # on this GPU (imports live on the peer's)
        metrics["stats_after_warmup"] = st
        metrics["nccl_bytes_on_this_gpu"] = here
        print(f"[rank {rank}] NCCL holds {here / MiB:.1f} MiB on this GPU through the shim "
              f"(local {st['local_bytes'] / MiB:.1f}, exported {st['exported_bytes'] / MiB:.1f}; "
              f"imported from peers {st['imported_bytes'] / MiB:.1f}; cuMemAlloc passed through "
              f"{st['passthrough_bytes'] / MiB:.1f}); free-memory estimate of NCCL's use "
              f"{metrics['nccl_estimate_bytes'] / MiB:.1f} MiB", flush=True)
        cycles = []
        for c in range(args.cycles):
            torch.cuda.synchronize(dev)
            free_before = torch.cuda.mem_get_info(dev)[0]
            t0 = time.perf_counter()
            shim.nccl_pause(group, local, local_world, args.timeout_ms)
            t1 = time.perf_counter()
            free_paused = torch.cuda.mem_get_info(dev)[0]
            paused_stats = shim.nccl_stats()
            if c == 0:  # the `nccl` tag as tagmem's own calls see it (tagmem_tag_stats_get)
                tag = shim.tag_stats("nccl", local)
                metrics["nccl_tag_paused"] = tag
                if tag["state"] != 1 or tag["host_bytes"] != paused_stats["backup_bytes"]:
                    failures.append(f"tag 'nccl' while paused: state {tag['state']} (1 wanted), "
                                    f"host_bytes {tag['host_bytes']} (backup_bytes "
                                    f"{paused_stats['backup_bytes']} wanted)")
            t2 = time.perf_counter()
            shim.nccl_resume(group, local, local_world, args.timeout_ms)
            t3 = time.perf_counter()
            outs = collectives(c, n, rank, world, dev)
            free_after = torch.cuda.mem_get_info(dev)[0]
            row = {"cycle": c + 1, "pause_s": t1 - t0, "resume_s": t3 - t2,
                   "given_back_bytes": free_paused - free_before, "free_paused": free_paused,
                   "free_after": free_after,
                   "released_local": paused_stats["last_released_local_bytes"],
                   "released_exported": paused_stats["last_released_exported_bytes"],
                   "released_imported": paused_stats["last_released_imported_bytes"],
                   "kept_bytes": paused_stats["last_kept_bytes"],
                   "kept_allocations": paused_stats["last_kept_allocations"]}
            if expected is not None and digest(outs) != expected[c]:
                failures.append(f"cycle {c + 1}: results differ from the run without pause")
            if c in before_pause and not identical(outs, before_pause[c]):
                failures.append(f"cycle {c + 1}: results differ from this process's before pausing")
            cycles.append(row)
        metrics["cycles_detail"] = cycles
        first = cycles[0]
        share = first["given_back_bytes"] / here if here else 0.0
        worst = min(r["given_back_bytes"] for r in cycles) / here if here else 0.0
        metrics["share_given_back"] = share
        metrics["share_given_back_worst_cycle"] = worst
        drift = max(abs(r["free_after"] - first["free_after"]) for r in cycles)
        drift_paused = max(abs(r["free_paused"] - first["free_paused"]) for r in cycles)
        metrics["max_drift_after_bytes"] = drift
        metrics["max_drift_paused_bytes"] = drift_paused
        pauses = sorted(r["pause_s"] for r in cycles)
        resumes = sorted(r["resume_s"] for r in cycles)
        metrics["pause_s_median"] = pauses[len(pauses) // 2]
        metrics["resume_s_median"] = resumes[len(resumes) // 2]
        print(f"[rank {rank}] pause gave back {first['given_back_bytes'] / MiB:.1f} MiB = "
              f"{100 * share:.1f}% of NCCL's {here / MiB:.1f} MiB here; released local "
              f"{first['released_local'] / MiB:.1f} / exported {first['released_exported'] / MiB:.1f}"
              f" / imported {first['released_imported'] / MiB:.1f} MiB; kept {first['kept_bytes'] / MiB:.1f}"
              f" MiB in {first['kept_allocations']} allocations; worst cycle {100 * worst:.1f}%; pause"
              f" {1000 * metrics['pause_s_median']:.1f}"
              f" ms, resume {1000 * metrics['resume_s_median']:.1f} ms (medians); free-memory drift over "
              f"{len(cycles)} cycles {drift / MiB:.2f} MiB (paused {drift_paused / MiB:.2f} MiB)", flush=True)
        if args.require_share > 0 and min(share, worst) < args.require_share:
            failures.append(f"a pause gave back {100 * min(share, worst):.1f}% of NCCL's memory on "
                            f"this GPU (< {100 * args.require_share:.0f}%)")
        if drift > 2 * MiB:
            failures.append(f"free memory drifted {drift / MiB:.2f} MiB from cycle 1 (> 2 MiB)")

    dist.barrier()
    dist.destroy_process_group()
    metrics["failures"] = failures
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    for msg in failures:
        print(f"[rank {rank}] FAIL: {msg}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
