"""torch_nccl_register.py — tagged tensors that NCCL registered, under libtagmem_preload.so.

Started by torchrun (one process per GPU) under LD_PRELOAD=libtagmem_preload.so with
TAGMEM_PRELOAD_TAG=torch, so every tensor is tagged memory of the tag `torch`. Each rank:

 1. allocates its buffers in a torch.cuda.MemPool and registers the pool with NCCL (the NCCL
    backend's register_mem_pool: ncclCommRegister, which the shim interposes);
 2. runs all_reduce and a send/recv ring on them (with peers, NCCL exports registered memory to
    them at the first use) and checks every result exactly (integer-valued floats);
 3. tries to offload `torch`. Where NCCL exported the memory it must be refused with
    TAGMEM_ERROR_PEER naming the tag and NCCL; where it did not (one rank, or an algorithm that
    did not register the buffer) the offload may succeed, and then the reload must bring back
    every byte and the collectives, run again while still registered, must stay exact;
 4. deregisters the pool, offloads and reloads `torch` (must succeed, every byte kept),
    registers it again and runs the collectives once more: exact results, peers on the new pages;
 5. with --graph: captures an all_reduce on an unregistered tensor in a CUDA graph (NCCL
    registers it for the graph on its own) and reports what an offload answers then; replays it
    and checks the result.
A watchdog dumps every thread's stack and ends the rank after --timeout seconds (a hang).
Prints one line per step; exits non-zero on a failed check.
"""
import argparse
import ctypes
import faulthandler
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tagmem_shim import TAGMEM_BACKUP, Shim  # noqa: E402

TAGMEM_ERROR_PEER = 11
TAG = "torch"


def values(seed, rank, n, dev):
    g = torch.Generator(device=dev)
    g.manual_seed(seed * 7919 + rank)
    return torch.randint(-1000, 1000, (n,), generator=g, device=dev).float()


class Rank:
    def __init__(self, args):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.n = args.elems
        self.shim = Shim()
        self.failed = False
        self.pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self.pool):
            self.data = torch.empty(self.n, device=self.dev)
            self.red = torch.empty(self.n, device=self.dev)
            self.got = torch.empty(self.n, device=self.dev)
        self.backend = dist.group.WORLD._get_backend(self.dev)

    def say(self, text):
        print(f"[rank {self.rank}] {text}", flush=True)

    def check(self, ok, what):
        self.say(("ok   " if ok else "FAIL ") + what)
        self.failed |= not ok

    def collectives(self, seed, what):
        self.data.copy_(values(seed, self.rank, self.n, self.dev))
        self.red.copy_(self.data)
        dist.all_reduce(self.red)
        ops = [dist.P2POp(dist.isend, self.data, (self.rank + 1) % self.world),
               dist.P2POp(dist.irecv, self.got, (self.rank - 1) % self.world)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        torch.cuda.synchronize(self.dev)
        want = sum(values(seed, r, self.n, self.dev) for r in range(self.world))
        prev = values(seed, (self.rank - 1) % self.world, self.n, self.dev)
        self.check(torch.equal(self.red, want) and torch.equal(self.got, prev),
                   f"{what}: all_reduce and send/recv exact")

    def offload(self):
        """Status and message of tagmem_offload(torch); reloads after a success."""
        torch.cuda.synchronize(self.dev)
        names = (ctypes.c_char_p * 1)(TAG.encode())
        status = self.shim.lib.tagmem_offload(names, 1, self.dev.index, TAGMEM_BACKUP)
        message = self.shim.lib.tagmem_last_error().decode() if status else ""
        if status == 0:
            self.shim.reload([TAG], self.dev.index)
        return status, message

    def bytes_kept(self, what, seed):
        self.check(torch.equal(self.data, values(seed, self.rank, self.n, self.dev)),
                   f"{what}: every byte of the buffer kept")

    def run(self, graph):
        self.backend.register_mem_pool(self.pool)
        self.collectives(1, "registered")
        dist.barrier()
        status, message = self.offload()
        if status == TAGMEM_ERROR_PEER:
            self.check(f"'{TAG}'" in message and "NCCL holds" in message,
                       f"offload while registered refused with PEER: {message}")
        else:
            self.check(status == 0, f"offload while registered: status {status} {message}")
            self.say("offload while registered allowed: NCCL did not share the buffer")
            self.bytes_kept("offload while registered", 1)
            self.collectives(2, "after that offload, still registered")
        dist.barrier()
        self.backend.deregister_mem_pool(self.pool)
        dist.barrier()
        self.data.copy_(values(3, self.rank, self.n, self.dev))
        status, message = self.offload()
        self.check(status == 0, f"offload after deregister_mem_pool: status {status} {message}")
        self.bytes_kept("offload after deregistering", 3)
        dist.barrier()
        self.backend.register_mem_pool(self.pool)
        self.collectives(4, "registered again after the reload")
        dist.barrier()
        if graph:
            self.graph_step()
        self.backend.deregister_mem_pool(self.pool)

    def graph_step(self):
        x = values(5, self.rank, self.n, self.dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(x)  # warm-up outside the capture, as PyTorch asks
        torch.cuda.current_stream().wait_stream(side)
        x.copy_(values(5, self.rank, self.n, self.dev))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(x)
        torch.cuda.synchronize(self.dev)
        dist.barrier()
        status, message = self.offload()
        self.say(f"offload with a captured collective: status {status} {message}")
        self.check(status in (0, TAGMEM_ERROR_PEER), "offload with a captured collective answered")
        dist.barrier()
        x.copy_(values(5, self.rank, self.n, self.dev))
        g.replay()
        torch.cuda.synchronize(self.dev)
        want = sum(values(5, r, self.n, self.dev) for r in range(self.world))
        self.check(torch.equal(x, want), "graph replay exact")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--elems", type=int, default=1 << 20)
    p.add_argument("--timeout", type=int, default=180)
    p.add_argument("--graph", action="store_true")
    args = p.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # a hang ends the rank
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    r = Rank(args)
    r.say(f"world {r.world}, {r.n} elements, buffers in tag "
          f"'{r.shim.tag_of(r.data.data_ptr())}'")
    if r.shim.tag_of(r.data.data_ptr()) != TAG:
        r.check(False, f"the buffers are not in tag '{TAG}' (TAGMEM_PRELOAD_TAG=torch?)")
    else:
        r.run(args.graph)
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    r.say("FAIL" if r.failed else "PASS")
    sys.exit(1 if r.failed else 0)


if __name__ == "__main__":
    main()
