"""slime's trainer call shape (tests only), run as its own process the way slime starts its Megatron
actors when the trainer is offloaded: under the preload hook library with TMS_INIT_ENABLE=1 and
TMS_INIT_ENABLE_CPU_BACKUP=1 (every cudaMalloc of the process pausable, backed up), with
NCCL_CUMEM_ENABLE=0. One training step over a NCCL group, then slime's sleep (empty the caches,
destroy the process groups, pause()), the parameters read while paused through
get_cpu_backup(x, zero_copy=True) (how slime's weight updater reads them), wake_up (resume(), the
groups made again) and the weight update inside disable(), whose buffers are ordinary memory.
Prints one JSON line of what it saw.

    python slime_like_trainer.py <seed> <nbytes> <rendezvous directory>
"""

import gc
import json
import sys


def main(seed, nbytes, rendezvous):
    import torch
    import torch.distributed as dist
    import torch_memory_saver
    from torch_memory_saver import torch_memory_saver as saver

    import tagmem

    made = []

    def group():  # a fresh rendezvous file for each group, as a file store is not reused
        made.append(None)
        dist.init_process_group("nccl", init_method=f"file://{rendezvous}/group{len(made)}",
                                rank=0, world_size=1)

    def tagged(t):
        try:
            return tagmem.pointer_info(t.data_ptr())["tag"]
        except tagmem.UnknownPointerError:
            return None

    def as_bytes(t):
        return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()

    out = {"tagmem": getattr(torch_memory_saver, "__tagmem__", False)}
    torch.cuda.set_device(0)
    group()
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = nbytes // 4 // 4
    params = [torch.randn(n, device="cuda", generator=g) for _ in range(4)]
    moments = [torch.zeros_like(p) for p in params]  # optimizer state, also in the default tag
    grads = [torch.randn(n, device="cuda", generator=g) for _ in range(4)]
    for p, m, gr in zip(params, moments, grads):  # one step, gradients reduced over the group
        dist.all_reduce(gr)
        m.mul_(0.9).add_(gr, alpha=0.1)
        p.add_(m, alpha=-1e-3)
    del grads
    torch.cuda.synchronize()
    out["owners"] = sorted({tagged(t) for t in params + moments}, key=str)
    expected = [as_bytes(t) for t in params + moments]

    # slime's sleep(): clear memory, destroy the groups, pause everything.
    gc.collect()
    torch.cuda.empty_cache()
    dist.destroy_process_group()
    free = torch.cuda.mem_get_info()[0]
    saver.pause()
    out["freed"] = torch.cuda.mem_get_info()[0] - free
    views = [saver.get_cpu_backup(p, zero_copy=True) for p in params]
    out["paused_views"] = [v is not None and torch.equal(v.view(torch.uint8).reshape(-1), e)
                           for v, e in zip(views, expected)]
    del views

    # wake_up(): resume, make the groups again.
    saver.resume()
    group()
    out["resumed"] = [torch.equal(as_bytes(t), e) for t, e in zip(params + moments, expected)]
    out["active_backup"] = [saver.get_cpu_backup(p, zero_copy=True) is None for p in params]

    # update_weights() inside disable(): buckets and NCCL traffic are ordinary memory.
    with saver.disable():
        bucket = torch.cat([p.reshape(-1) for p in params])
        dist.broadcast(bucket, src=0)
        out["bucket_owner"] = tagged(bucket)
        out["bucket_equal"] = torch.equal(as_bytes(bucket), torch.cat(expected[: len(params)]))
        del bucket
    dist.destroy_process_group()

    # The next cycle keeps every byte.
    gc.collect()
    torch.cuda.empty_cache()
    saver.pause()
    saver.resume()
    out["second_cycle"] = all(torch.equal(as_bytes(t), e) for t, e in zip(params + moments, expected))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
