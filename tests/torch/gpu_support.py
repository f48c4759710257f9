"""Helpers shared by the PyTorch GPU tests (test_gpu_*.py, fsdp2_two_gpu.py)."""

import os

import torch

MiB = 1 << 20
# TAGMEM_TEST_SIZE=small shrinks the large tensors (quick runs); the default is full.
SMALL = os.environ.get("TAGMEM_TEST_SIZE", "full") == "small"


def device_free_bytes(device=None):
    """Free device memory as the driver reports it."""
    return torch.cuda.mem_get_info(device)[0]


def snapshot(tensors):
    """(data_ptr, CPU copy) for each tensor, to compare after an offload/reload cycle."""
    torch.cuda.synchronize()
    return [(t.data_ptr(), t.detach().cpu().clone()) for t in tensors]


def assert_unchanged(tensors, before):
    """Every tensor has the same data_ptr() and bit-identical values as in `before`."""
    for i, (t, (ptr, values)) in enumerate(zip(tensors, before)):
        assert t.data_ptr() == ptr, f"tensor {i}: data_ptr moved"
        now = t.detach().cpu()
        assert now.dtype == values.dtype and now.shape == values.shape
        assert torch.equal(as_bytes(now), as_bytes(values)), f"tensor {i}: values changed"


def as_bytes(t):
    """The tensor's elements as a flat uint8 tensor (bitwise comparison, NaNs included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def capture_matmul_relu(x, w, capture):
    """Warms ``(x @ w).relu()`` up on a side stream, then captures it inside `capture` (a
    torch.cuda.graph-like context manager, already built around a CUDAGraph); returns the graph's
    output tensor after one replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (x @ w).relu()
    torch.cuda.current_stream().wait_stream(side)
    with capture:
        y = (x @ w).relu()
    return y


def run_spawned_scheduler(run, args, configure_subprocess):
    """Starts ``run(results, *args)`` in a process made with the spawn method inside
    `configure_subprocess()` (as SGLang starts its schedulers), waits for the dict it puts on
    `results` and for its exit; returns (that dict, the exit code)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with configure_subprocess():
        proc = ctx.Process(target=run, args=(results, *args))
        proc.start()
    out = results.get(timeout=300)
    proc.join(60)
    return out, proc.exitcode
