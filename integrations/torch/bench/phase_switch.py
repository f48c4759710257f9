"""Phase-switch benchmark: 8B-shaped weights as PyTorch tensors, tagmem vs ``p.data.to("cpu")``.

The weights have the shapes of a Llama-3-8B checkpoint (291 bf16 tensors, ~16 GB at --scale 1).
In one process, one method after the other on the same shapes:

- tagmem: parameters created in ``tagmem.torch.tag("bench_weights")`` (MemPool mode); offload =
  ``tagmem.torch.offload`` (backup), reload = ``tagmem.torch.reload``.
- baseline: ``p.data = p.data.to("cpu")`` for every parameter, then ``torch.cuda.empty_cache()``
  so the memory is really given back; reload = ``p.data = p.data.to("cuda")``.

Each cycle times offload and reload (synchronised), and records how much device memory the
offload freed (driver view). Cycle 1 includes one-time costs (tagmem pins its host store during its
first offload); steady state is the median of cycles 2..N. After the last cycle every tensor is
compared bit for bit with a CPU copy taken before the first (--no-verify skips that).

    python3 integrations/torch/bench/phase_switch.py --cycles 5 --out bench.json
    python3 integrations/torch/bench/phase_switch.py --layers 2 --scale 8   # small and quick

``--scenario rl_cycle`` runs the RL cycle instead (rl_cycle.py: weights + optimizer backed up, a
60 GiB kv cache discarded, tagmem against torch_memory_saver's modes and a vLLM sleep-mode
baseline built from a vLLM source checkout, each in its own process); the other arguments are then
rl_cycle.py's:

    python3 integrations/torch/bench/phase_switch.py --scenario rl_cycle \
        --methods tagmem,vllm_sleep --vllm-src VLLM_CHECKOUT
"""

import argparse
import json
import statistics
import time

from workload import llama8b_shapes, make_parameters

GB = 1e9
# Imported by load_tagmem() once the scenario is known: the rl_cycle scenario runs every method in
# a process of its own and needs neither here.
torch = tagmem = tt = None


def load_tagmem():
    global torch, tagmem, tt
    import torch
    import tagmem
    import tagmem.torch as tt


def free_bytes():
    return torch.cuda.mem_get_info()[0]


def run_cycles(params, offload, reload, cycles):
    rows = []
    for _ in range(cycles):
        torch.cuda.synchronize()
        before = free_bytes()
        t0 = time.perf_counter()
        offload(params)
        t1 = time.perf_counter()
        freed = free_bytes() - before
        reload(params)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rows.append({"offload_s": t1 - t0, "reload_s": t2 - t1, "freed_bytes": freed})
    return rows


def verify(params, copies):
    for i, (p, c) in enumerate(zip(params, copies)):
        if not torch.equal(p.data.cpu().view(torch.int16), c.view(torch.int16)):
            raise SystemExit(f"FAIL: tensor {i} changed after the cycles")


def tagmem_offload(params):
    tt.offload("bench_weights")


def tagmem_reload(params):
    tt.reload("bench_weights")


def baseline_offload(params):
    for p in params:
        p.data = p.data.to("cpu")
    torch.cuda.empty_cache()


def baseline_reload(params):
    for p in params:
        p.data = p.data.to("cuda")


def summarise(name, rows, nbytes):
    steady = rows[1:] or rows
    off = statistics.median(r["offload_s"] for r in steady)
    rel = statistics.median(r["reload_s"] for r in steady)
    return {
        "method": name,
        "cycle1_offload_s": rows[0]["offload_s"],
        "cycle1_reload_s": rows[0]["reload_s"],
        "steady_offload_s": off,
        "steady_reload_s": rel,
        "steady_offload_GBps": nbytes / off / GB,
        "steady_reload_GBps": nbytes / rel / GB,
        "steady_switch_s": off + rel,
        "freed_GB_min": min(r["freed_bytes"] for r in rows) / GB,
        "cycles": rows,
    }


def main():
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--scenario", default="weights", choices=("weights", "rl_cycle"))
    known, rest = pre.parse_known_args()
    if known.scenario == "rl_cycle":
        import rl_cycle

        raise SystemExit(rl_cycle.main(rest))
    load_tagmem()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1, help="divide every width (quick runs)")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(rest)

    shapes = llama8b_shapes(args.layers, args.scale)
    nbytes = sum(2 * torch.Size(s).numel() for _, s in shapes)
    print(f"{len(shapes)} tensors, {nbytes / GB:.2f} GB bf16, {args.cycles} cycles, "
          f"{torch.cuda.get_device_name()}", flush=True)
    results = []

    with tt.tag("bench_weights"):
        params = make_parameters(shapes, seed=0)
    copies = None if args.no_verify else [p.data.cpu() for p in params]
    results.append(summarise("tagmem (backup)", run_cycles(params, tagmem_offload, tagmem_reload, args.cycles), nbytes))
    if copies is not None:
        verify(params, copies)
    del params
    tt.empty_cache("bench_weights")
    tagmem.host_trim(0)  # the baseline gets the host memory the pinned store held

    params = make_parameters(shapes, seed=0)
    results.append(summarise('p.data.to("cpu") / .to("cuda")', run_cycles(params, baseline_offload, baseline_reload, args.cycles), nbytes))
    if copies is not None:
        verify(params, copies)

    print("\n| method | cycle 1 offload | cycle 1 reload | steady offload | steady reload | steady switch | offload GB/s | reload GB/s | freed GB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['method']} | {r['cycle1_offload_s']:.3f} s | {r['cycle1_reload_s']:.3f} s | "
              f"{r['steady_offload_s']:.3f} s | {r['steady_reload_s']:.3f} s | {r['steady_switch_s']:.3f} s | "
              f"{r['steady_offload_GBps']:.1f} | {r['steady_reload_GBps']:.1f} | {r['freed_GB_min']:.2f} |")
    print(f"\nverified bit for bit after the cycles: {copies is not None}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"tensors": len(shapes), "bytes": nbytes, "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
