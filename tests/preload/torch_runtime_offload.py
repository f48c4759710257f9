"""torch_runtime_offload.py — an unmodified PyTorch workload under the shim.

Run as `LD_PRELOAD=libtagmem_preload.so TAGMEM_PRELOAD_TAG=torch python3 torch_runtime_offload.py`.
The workload part is plain PyTorch (tensors of several dtypes and sizes, a view into a larger
tensor at a nonzero offset, a matmul); PyTorch's caching allocator gets its memory from
cudaMalloc, which the shim routes to the tag named by TAGMEM_PRELOAD_TAG. The control part
offloads and reloads that tag through tagmem's C API (ctypes) and checks that every tensor
keeps its address and every byte, that the offload gave the device memory back, and that
computing on the reloaded tensors gives the same result as before. Exits non-zero on failure.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tagmem_shim import Shim  # noqa: E402

MiB = 1 << 20


def same_bits(a, b):
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a, b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elems", type=int, default=1 << 24, help="elements of the largest tensor")
    ap.add_argument("--cycles", type=int, default=5)
    args = ap.parse_args()
    tag = os.environ.get("TAGMEM_PRELOAD_TAG")
    if not tag:
        print("FAIL: TAGMEM_PRELOAD_TAG is not set")
        return 1
    shim = Shim()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    failures = []

    # ---- the unmodified workload -------------------------------------------------------------
    g = torch.Generator(device=dev)
    g.manual_seed(1234)
    n = args.elems
    big = torch.randn(n, generator=g, device=dev)
    view = big[n // 3: n // 3 + n // 4]  # a view at a nonzero storage offset
    half = torch.randn(n // 2, generator=g, device=dev).to(torch.bfloat16)
    ints = torch.randint(0, 1 << 30, (n // 8,), generator=g, device=dev, dtype=torch.int32)
    small = [torch.randn(17 + i * 1000, generator=g, device=dev) for i in range(50)]
    a = torch.randn(1024, 1024, generator=g, device=dev)
    b = torch.randn(1024, 1024, generator=g, device=dev)
    product = a @ b
    tensors = [big, view, half, ints, a, b, product] + small
    torch.cuda.synchronize(dev)

    # ---- control through tagmem's C API -------------------------------------------------------
    for t in tensors:
        owner = shim.tag_of(t.data_ptr())
        if owner != tag:
            failures.append(f"tensor at {t.data_ptr():#x} is in tag {owner!r}, not {tag!r}")
    ptrs = [t.data_ptr() for t in tensors]
    copies = [t.cpu().clone() for t in tensors]
    mapped = shim.tag_stats(tag, 0)["mapped_bytes"]
    print(f"tag '{tag}' maps {mapped / MiB:.1f} MiB for {len(tensors)} tensors "
          f"(PyTorch reserved {torch.cuda.memory_reserved(dev) / MiB:.1f} MiB)", flush=True)
    for c in range(args.cycles):
        torch.cuda.synchronize(dev)
        free_before = torch.cuda.mem_get_info(dev)[0]
        shim.offload([tag], 0)
        free_off = torch.cuda.mem_get_info(dev)[0]
        shim.reload([tag], 0)
        given = free_off - free_before
        if given < 0.9 * mapped:
            failures.append(f"cycle {c + 1}: offload gave back {given / MiB:.1f} MiB of {mapped / MiB:.1f}")
        for t, p, ref in zip(tensors, ptrs, copies):
            if t.data_ptr() != p:
                failures.append(f"cycle {c + 1}: a tensor moved from {p:#x} to {t.data_ptr():#x}")
            if not same_bits(t.cpu(), ref):
                failures.append(f"cycle {c + 1}: a tensor at {p:#x} lost its values")
        if not torch.equal((a @ b).cpu(), product.cpu()):
            failures.append(f"cycle {c + 1}: a @ b differs after reload")
        print(f"cycle {c + 1}: offload gave back {given / MiB:.1f} MiB; values and addresses kept",
              flush=True)
    extra = torch.ones(n // 4, device=dev)  # allocation after the cycles still works
    if float(extra.double().sum()) != float(n // 4):
        failures.append("a tensor allocated after the cycles is wrong")
    for msg in failures[:20]:
        print("FAIL:", msg)
    print("runtime offload:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
