"""torch_free_ordering.py — cudaFree through the shim waits for work still queued on the device.

Run as `LD_PRELOAD=libtagmem_preload.so TAGMEM_PRELOAD_TAG=torch python3 torch_free_ordering.py`
on one GPU. Each trial allocates a tensor on a side stream, queues many kernels that write it
there, frees it at once (PyTorch's caching allocator keeps the block for that stream) and calls
torch.cuda.empty_cache(), which hands the block to cudaFree while the kernels still run. A new
tensor of the same size on the default stream, usually at the same address, is then filled from
a random reference; after a device synchronize it must equal the reference byte for byte.
PyTorch frees cached blocks without recording events because CUDA's cudaFree synchronizes the
device; a cudaFree that does not would let the side stream's kernels overwrite the new tensor.
Exits non-zero if any byte of any trial was overwritten, or if under the shim no trial reused
the freed address (then nothing was checked).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tagmem_shim import Shim, TagmemError  # noqa: E402

MiB = 1 << 20


def trial(dev, nbytes, kernels, seed):
    # Start every trial from an empty cache, as the first one does: blocks cached by the last
    # trial would otherwise be freed by this trial's empty_cache() too, and the new tensor could
    # land on one of them instead of on the block the side stream is still writing.
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    reference = torch.randint(0, 256, (nbytes,), generator=g, device=dev, dtype=torch.uint8)
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        old = torch.empty(nbytes, device=dev, dtype=torch.uint8)
        for k in range(kernels):
            old.fill_(k % 251)
    old_ptr = old.data_ptr()
    del old  # back to the cache of the side stream; its kernels are still queued
    torch.cuda.empty_cache()  # cudaFree of the cached block
    new = torch.empty(nbytes, device=dev, dtype=torch.uint8)  # default stream
    new.copy_(reference)
    torch.cuda.synchronize(dev)
    overwritten = int((new != reference).sum().item())
    return overwritten, new.data_ptr() == old_ptr, new.data_ptr()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="size of each tensor in MiB")
    ap.add_argument("--kernels", type=int, default=400, help="kernels queued on the side stream")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    try:
        shim = Shim()
    except TagmemError:
        shim = None
    tag = os.environ.get("TAGMEM_PRELOAD_TAG")
    if shim is not None and not tag:
        print("FAIL: under the shim TAGMEM_PRELOAD_TAG must be set (PyTorch's memory in a tag)")
        return 1
    print(f"{'under the shim, tag ' + repr(tag) if shim else 'without the shim'}: "
          f"{args.trials} trials of {args.mib} MiB, {args.kernels} kernels each", flush=True)
    nbytes = args.mib * MiB
    total_overwritten = 0
    reused = 0
    failures = []
    for t in range(args.trials):
        overwritten, same_address, ptr = trial(dev, nbytes, args.kernels, 1000 + t)
        total_overwritten += overwritten
        reused += same_address
        owner = shim.tag_of(ptr) if shim else None
        print(f"trial {t + 1}: new tensor at {ptr:#x} "
              f"({'the freed address' if same_address else 'another address'}"
              f"{', tag ' + repr(owner) if shim else ''}): {overwritten} of {nbytes} bytes "
              f"overwritten", flush=True)
        if shim and owner != tag:
            failures.append(f"trial {t + 1}: the new tensor is in tag {owner!r}, not {tag!r}")
    if total_overwritten:
        failures.append(f"{total_overwritten} of {nbytes * args.trials} bytes of the new tensors "
                        "were overwritten by kernels queued before cudaFree")
    if shim and reused == 0:
        failures.append("no trial reused the freed address: the scenario did not happen")
    for msg in failures:
        print("FAIL:", msg)
    print(f"free ordering: {total_overwritten} bytes overwritten, address reused in {reused} of "
          f"{args.trials} trials:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
