"""FSDP2 (fully_shard) on two GPUs with parameters, gradients and optimizer state in tags.

Run with ``torchrun --standalone --nproc-per-node 2 tests/torch/fsdp2_two_gpu.py [steps]``
(gpu_run.sh --two-gpu does). Each rank trains the same sharded model twice from the same seed:
once plainly, once offloading every tag (backup) between steps and after each backward. The second
run must match the first bit for bit (losses, parameters, optimizer state), and every DTensor local
shard must keep its data_ptr() across each cycle. Exits non-zero on any mismatch; rank 0 prints
PASS/FAIL lines.
"""

import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

try:
    import tagmem
except ImportError:  # not installed: the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "integrations", "torch"))
    import tagmem
import tagmem.torch as tt  # noqa: E402


def as_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def cuda_state(optimizer):
    return [local(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and local(v).is_cuda]


def build(prefix):
    torch.manual_seed(0)
    with tt.tag(f"{prefix}_params"):
        model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(4)], nn.Linear(512, 16))
        model = model.cuda()
        for layer in model[:-1]:
            fully_shard(layer)
        fully_shard(model)  # sharded parameters are created here, inside the tag
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer


def cycle(tags, tensors, failures, what):
    """Offloads and reloads `tags`; every tensor must keep its address and bytes."""
    torch.cuda.synchronize()
    before = [(t.data_ptr(), t.detach().clone().cpu()) for t in tensors]
    tt.offload(tags)
    for t in tags:
        if tagmem.stats(t, torch.cuda.current_device())["mapped_bytes"] != 0:
            failures.append(f"{what}: tag {t} still mapped after offload")
    tt.reload(tags)
    for i, (t, (ptr, values)) in enumerate(zip(tensors, before)):
        if t.data_ptr() != ptr:
            failures.append(f"{what}: tensor {i} moved")
        if not torch.equal(as_bytes(t.cpu()), as_bytes(values)):
            failures.append(f"{what}: tensor {i} changed")


def train(prefix, steps, offload, failures):
    model, optimizer = build(prefix)
    tags = [f"{prefix}_params", f"{prefix}_grads", f"{prefix}_optim"]
    rank = dist.get_rank()
    generator = torch.Generator(device="cuda").manual_seed(100 + rank)
    losses = []
    for step in range(steps):
        x = torch.randn(32, 512, device="cuda", generator=generator)
        y = torch.randn(32, 16, device="cuda", generator=generator)
        with tt.tag(f"{prefix}_grads", all_threads=True):
            loss = F.mse_loss(model(x), y)
            loss.backward()
        losses.append(loss.detach().clone())
        if offload:
            present = [t for t in tags if t in tagmem.tags(torch.cuda.current_device())]
            grads = [local(p.grad) for p in model.parameters()]
            cycle(present, [local(p) for p in model.parameters()] + grads, failures, f"step {step} grads")
        with tt.tag(f"{prefix}_optim"):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if offload:
            cycle(tags, [local(p) for p in model.parameters()] + cuda_state(optimizer), failures, f"step {step}")
    owners = {tagmem.pointer_info(local(p).data_ptr())["tag"] for p in model.parameters()}
    params = [local(p).detach().cpu().clone() for p in model.parameters()]
    state = [v.cpu().clone() for v in cuda_state(optimizer)]
    state_owners = {tagmem.pointer_info(v.data_ptr())["tag"] for v in cuda_state(optimizer)}
    return torch.stack(losses).cpu(), params, state, owners, state_owners


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    failures = []
    ref = train("fsdp_ref", steps, False, failures)
    got = train("fsdp_cyc", steps, True, failures)
    if got[3] != {"fsdp_cyc_params"}:
        failures.append(f"sharded parameters live in {got[3]}, not fsdp_cyc_params")
    if got[4] != {"fsdp_cyc_optim"}:
        failures.append(f"optimizer state lives in {got[4]}, not fsdp_cyc_optim")
    if not torch.equal(got[0], ref[0]):
        failures.append(f"losses differ: {got[0].tolist()} vs {ref[0].tolist()}")
    for name, a_list, b_list in (("parameter", got[1], ref[1]), ("optimizer state", got[2], ref[2])):
        if len(a_list) != len(b_list):
            failures.append(f"{name} count differs")
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            if not torch.equal(as_bytes(a), as_bytes(b)):
                failures.append(f"{name} shard {i} differs from the run without offload")
    flags = torch.tensor([len(failures)], device="cuda")
    dist.all_reduce(flags)
    for line in failures:
        print(f"rank {rank}: FAIL {line}", flush=True)
    if rank == 0:
        verdict = "PASS" if flags.item() == 0 else "FAIL"
        print(f"{verdict} fsdp2 two-gpu: {steps} steps, losses {ref[0].tolist()}, "
              f"{len(ref[1])} parameter shards and {len(ref[2])} state tensors bit-identical per rank "
              f"with and without offload: {flags.item() == 0}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if flags.item() == 0 else 1)


if __name__ == "__main__":
    main()
