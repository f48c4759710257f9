"""CUDA IPC of tagged tensors on a GPU with PyTorch: a 4 MiB tensor sent through a
torch.multiprocessing queue to a spawned process that reads it and writes it.

    python tests/torch/ipc_torch_gpu.py mempool|direct|global|shim|dropin|bucket|bandwidth|cycles

  mempool   tagmem.torch MemPool mode (tagmem's ForkingPickler reduction)
  direct    MemPool mode, the sender calling torch.multiprocessing.reductions.reduce_tensor itself
            and sending its (rebuild, args), which the receiver calls (verl's and OpenRLHF's shape)
  global    tagmem.torch.install() (the same reduction; PyTorch's own path has no IPC for a
            CUDAPluggableAllocator)
  shim      plain PyTorch under libtagmem_preload.so with TAGMEM_PRELOAD_TAG=torch (run it with
            LD_PRELOAD set): PyTorch's own reduce_tensor, whose cudaIpcGetMemHandle and
            cudaIpcOpenMemHandle the shim answers; tagmem.torch is not imported
  dropin    tagmem's torch_memory_saver drop-in in torch hook mode: the tensor made inside
            region(tag, enable_cpu_backup=True), pause refused while the other process maps it,
            pause and resume after
  bucket    SGLang's call shape: a flattened bucket of several weights, ForkingPickler.dumps in
            the trainer, loads in the engine, copied into the engine's own tagged weights; both
            processes' tags offload and reload before and after
  bandwidth a 4 GiB tagged bucket opened in the other process and copied there device to
            device, against a device-to-device copy of the same size in that process
  cycles    10,000 opens and closes of one export; descriptors and device memory checked in both
            processes

Each run needs TAGMEM_JOB (one job for both processes) and a private TAGMEM_PEER_DIR, which the
spawned process inherits. Every check is byte for byte against seeded random data; the script
prints one line "<mode>: PASS ..." or raises.
"""

import gc
import os
import sys
import time

import torch
import torch.multiprocessing as mp

MiB = 1 << 20
MODE = sys.argv[1] if len(sys.argv) > 1 else "mempool"


def seeded(seed, n, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to(device)


def fds():
    return len(os.listdir("/proc/self/fd"))


def tag_api():
    import tagmem

    return tagmem


def offload_reload(tag):
    tm = tag_api()
    torch.cuda.synchronize()
    tm.offload(tag, device=0)
    tm.reload(tag, device=0)


def wait_importers(n):
    tm = tag_api()
    for _ in range(1000):
        if tm.ipc_stats()["importers"] == n:
            return
        time.sleep(0.01)
    raise AssertionError(f"importers stayed {tm.ipc_stats()['importers']}, expected {n}")


# ---- the receiving process ---------------------------------------------------------------------


def child(inbox, outbox):
    torch.cuda.set_device(0)
    x, seed, seed2 = inbox.get()
    if isinstance(x, tuple):  # reduce_tensor's (rebuild, args), as the sender called it
        x = x[0](*x[1])
    ok = torch.equal(x.cpu().view(torch.uint8).flatten(), seeded(seed, 4 * MiB))
    outbox.put(("read", ok, x.data_ptr(), x.device.index))
    x.view(torch.uint8).flatten().copy_(seeded(seed2, 4 * MiB, "cuda"))
    torch.cuda.synchronize()
    outbox.put(("written",))
    assert inbox.get() == "drop"
    del x
    gc.collect()
    torch.cuda.synchronize()
    outbox.put(("dropped",))
    assert inbox.get() == "exit"


def run_queue(mode):
    tag = "torch" if mode == "shim" else "w"
    if mode == "global":
        import tagmem.torch as tt

        tt.install()
    elif mode in ("mempool", "direct"):
        import tagmem.torch as tt
    elif mode == "dropin":
        from tagmem.compat.torch_memory_saver import torch_memory_saver as saver
    seed, seed2 = 1234567, 7654321
    data = seeded(seed, 4 * MiB)
    if mode == "shim":
        x = data.to("cuda").view(torch.float32)  # the shim routes PyTorch's cudaMalloc to tagmem
    elif mode == "dropin":
        with saver.region(tag=tag, enable_cpu_backup=True):
            x = data.to("cuda").view(torch.float32)
    else:
        with tt.tag(tag):
            x = data.to("cuda").view(torch.float32)
    tm = tag_api()
    info = tm.pointer_info(x.data_ptr())
    # The drop-in names its tagmem tag after the region's tag (a suffix per backup wish).
    assert info["tag"] == tag or (mode == "dropin" and info["tag"].startswith(tag)), info

    def pause():
        if mode == "dropin":
            saver.pause(tag)  # synchronizes the device itself
        else:
            torch.cuda.synchronize()
            tm.offload(tag, device=0)

    def resume():
        if mode == "dropin":
            saver.resume(tag)
        else:
            tm.reload(tag, device=0)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(inbox, outbox))
    p.start()
    if mode == "direct":
        inbox.put((torch.multiprocessing.reductions.reduce_tensor(x), seed, seed2))
    else:
        inbox.put((x, seed, seed2))
    kind, same, ptr, device = outbox.get(timeout=120)
    assert kind == "read" and same, "the other process read other bytes"
    assert outbox.get(timeout=60) == ("written",)
    assert torch.equal(x.view(torch.uint8).cpu(), seeded(seed2, 4 * MiB)), "writes not seen"
    assert tm.ipc_stats()["importers"] >= 1
    try:
        pause()
        raise AssertionError("offload went ahead while another process maps the tag")
    except tm.PeerError as e:
        assert f"pid {p.pid}" in str(e), str(e)
    inbox.put("drop")
    assert outbox.get(timeout=60) == ("dropped",)
    wait_importers(0)
    pause()
    resume()
    assert torch.equal(x.view(torch.uint8).cpu(), seeded(seed2, 4 * MiB)), "lost by offload"
    inbox.put("exit")
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    print(f"{mode}: PASS 4 MiB read and written by pid {p.pid} at {ptr:#x} on cuda:{device}; "
          "offload refused while mapped, done after")


# ---- SGLang's call shape -----------------------------------------------------------------------


def engine(inbox, outbox):
    import tagmem.torch as tt
    from multiprocessing.reduction import ForkingPickler

    torch.cuda.set_device(0)
    shapes, seed = inbox.get()
    with tt.tag("engine"):
        weights = [torch.zeros(s, dtype=torch.bfloat16, device="cuda") for s in shapes]
    offload_reload("engine")
    payload = inbox.get()
    bucket = ForkingPickler.loads(payload)  # MultiprocessingSerializer.deserialize
    at = 0
    for w in weights:
        n = w.numel()
        w.copy_(bucket[at : at + n].view(w.shape))
        at += n
    torch.cuda.synchronize()
    del bucket
    gc.collect()
    outbox.put("copied")
    offload_reload("engine")
    expect = seeded(seed, at * 2).view(torch.bfloat16)
    got = torch.cat([w.flatten().cpu() for w in weights])
    outbox.put(torch.equal(got.view(torch.uint8), expect.view(torch.uint8)))


def run_bucket():
    import tagmem.torch as tt
    from multiprocessing.reduction import ForkingPickler

    shapes = [(1024, 512), (4096,), (333, 77), (2048, 1024)]
    total = sum(torch.Size(s).numel() for s in shapes)
    seed = 424242
    with tt.tag("trainer"):
        bucket = seeded(seed, total * 2, "cuda").view(torch.bfloat16)
    offload_reload("trainer")
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=engine, args=(inbox, outbox))
    p.start()
    inbox.put((shapes, seed))
    inbox.put(bytes(ForkingPickler.dumps(bucket)))  # MultiprocessingSerializer.serialize
    assert outbox.get(timeout=120) == "copied"
    wait_importers(0)
    offload_reload("trainer")
    assert outbox.get(timeout=120) is True, "the engine's weights differ"
    p.join(60)
    assert p.exitcode == 0
    print(f"bucket: PASS {total * 2} bytes, trainer and engine tags offloaded before and after")


# ---- bandwidth and cycles (the plain API) ------------------------------------------------------


def timed_copy(dst, src, reps=5):
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return src.numel() / best / 1e9


def bandwidth_child(inbox, outbox):
    import tagmem

    torch.cuda.set_device(0)
    torch.cuda.init()
    handle, nbytes = inbox.get()
    m = tagmem.ipc_open(handle)
    from tagmem.torch._ipc import _ArrayInterface

    src = torch.as_tensor(_ArrayInterface(m), device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    local = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    local.fill_(7)
    shared = timed_copy(dst, src)
    plain = timed_copy(dst, local)
    del src
    gc.collect()
    m.close()
    outbox.put((shared, plain))


def run_bandwidth():
    import tagmem.torch as tt

    nbytes = 4 << 30
    with tt.tag("big"):
        x = torch.full((nbytes,), 3, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    handle = tag_api().ipc_export(x.data_ptr(), nbytes)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=bandwidth_child, args=(inbox, outbox))
    p.start()
    inbox.put((handle, nbytes))
    shared, plain = outbox.get(timeout=300)
    p.join(60)
    ratio = shared / plain
    print(f"bandwidth: {'PASS' if ratio >= 0.9 else 'FAIL'} 4 GiB from the other process "
          f"{shared:.1f} GB/s, local device-to-device {plain:.1f} GB/s, ratio {ratio:.3f}")


def cycles_child(inbox, outbox):
    import tagmem

    torch.cuda.set_device(0)
    torch.cuda.init()
    handle, n = inbox.get()
    m = tagmem.ipc_open(handle)  # the driver's own descriptors open once, before counting
    m.close()
    free0 = torch.cuda.mem_get_info()[0]
    f0 = fds()
    for _ in range(n):
        tagmem.ipc_open(handle).close()
    outbox.put((fds() - f0, tagmem.ipc_stats()["open_here"], free0 - torch.cuda.mem_get_info()[0]))


def run_cycles():
    import tagmem.torch as tt

    with tt.tag("c"):
        x = torch.ones(2 * MiB, dtype=torch.uint8, device="cuda")
    handle = tag_api().ipc_export(x.data_ptr(), x.numel())
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    f0 = fds()  # the queues' pipes already open
    p = ctx.Process(target=cycles_child, args=(inbox, outbox))
    p.start()
    inbox.put((handle, 10000))
    fd_delta, open_here, mem_delta = outbox.get(timeout=300)
    p.join(60)
    p.close()  # its sentinel descriptor
    wait_importers(0)
    opened = tag_api().ipc_stats()["opened_by_peers"]
    exporter_fds = fds() - f0
    ok = (fd_delta == 0 and open_here == 0 and mem_delta == 0 and opened == 10001
          and exporter_fds == 0)
    print(f"cycles: {'PASS' if ok else 'FAIL'} importer fds {fd_delta:+d}, open {open_here}, "
          f"device memory {mem_delta:+d} B; exporter opened_by_peers {opened}, "
          f"fds {exporter_fds:+d}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    {m: run_queue for m in ("mempool", "direct", "global", "shim", "dropin")}.get(
        MODE, lambda m: None
    )(MODE)
    {"bucket": run_bucket, "bandwidth": run_bandwidth, "cycles": run_cycles}.get(
        MODE, lambda: None
    )()
