"""SGLang's memory-saver call shape (tests only), run in a scheduler process that the parent starts
with the spawn method inside torch_memory_saver.configure_subprocess(): weights in
region("weights", enable_cpu_backup=...), the KV pool in region("kv_cache") under a MemPool of its
own, a CUDA graph in cuda_graph(tag="cuda_graph"); release_memory_occupation releases kv_cache,
weights, cuda_graph in that order, resume_memory_occupation resumes cuda_graph, weights and
kv_cache, and the trainer's weights are written in place (update_weights_from_tensor) between
the weights' resume and the KV cache's. Reports what it saw to the parent as a dict.

The order and the checks are plain functions (release_order, resume_order, plan_checks) so that
the emulator tests can run them without PyTorch."""

RELEASE_ORDER = ("kv_cache", "weights", "cuda_graph")
RESUME_ORDER = ("cuda_graph", "weights", "kv_cache")


def release(saver, tags=RELEASE_ORDER):
    """SGLang's release_memory_occupation: each tag paused on its own, in SGLang's order."""
    for tag in tags:
        saver.pause(tag)


def resume(saver, update_weights, tags=RESUME_ORDER):
    """SGLang's resume_memory_occupation with the weight update an RL trainer makes between the
    weights' resume and the KV cache's (update_weights is called right after "weights")."""
    for tag in tags:
        saver.resume(tag)
        if tag == "weights":
            update_weights()


def run(results, nbytes, seed, cpu_backup):
    try:
        results.put(_run(nbytes, seed, cpu_backup))
    except BaseException as e:  # the parent reports it
        results.put({"error": f"{type(e).__name__}: {e}"})


def _run(nbytes, seed, cpu_backup):
    import os

    import torch
    import torch_memory_saver
    from torch_memory_saver import torch_memory_saver as saver

    from gpu_support import as_bytes, capture_matmul_relu  # tests/torch, on the parent's path

    out = {"tagmem": getattr(torch_memory_saver, "__tagmem__", False)}
    out["ld_preload"] = os.environ.get("LD_PRELOAD", "")
    g = torch.Generator(device="cuda").manual_seed(seed)
    with saver.region(tag="weights", enable_cpu_backup=cpu_backup):
        weights = torch.randn(nbytes // 4, device="cuda", generator=g)
    with saver.region(tag="kv_cache"):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            kv = torch.zeros(nbytes // 4, device="cuda")
    out["mode"] = saver.hook_mode
    w = weights[: 256 * 256].view(256, 256)
    x = torch.randn(64, 256, device="cuda", generator=g)
    graph = torch.cuda.CUDAGraph()
    y = capture_matmul_relu(x, w, saver.cuda_graph(graph, tag="cuda_graph"))
    # What the graph computes from the new weights, found by replaying it before the release.
    w0 = weights.clone()
    w1 = torch.randn(weights.shape, device="cuda", generator=g)
    weights.copy_(w1)
    graph.replay()
    y1 = as_bytes(y).cpu().clone()
    weights.copy_(w0)
    graph.replay()
    torch.cuda.synchronize()
    expected_w0, expected_w1 = as_bytes(w0).cpu(), as_bytes(w1).cpu()
    del w0
    free = torch.cuda.mem_get_info()[0]
    release(saver)
    torch.cuda.synchronize()
    out["freed"] = torch.cuda.mem_get_info()[0] - free
    if cpu_backup:
        view = saver.get_cpu_backup(weights, zero_copy=True)
        out["backup_equal"] = torch.equal(as_bytes(view), expected_w0)
        del view
    seen = {}

    def update_weights():
        # The weights are back (their old bytes with a CPU backup) before the KV cache is.
        seen["weights_back"] = torch.equal(as_bytes(weights).cpu(), expected_w0)
        weights.copy_(w1)  # update_weights_from_tensor: the new bytes, in place
        torch.cuda.synchronize()

    resume(saver, update_weights)
    out["weights_back"] = seen.get("weights_back")
    out["weights_updated"] = torch.equal(as_bytes(weights).cpu(), expected_w1)
    graph.replay()
    torch.cuda.synchronize()
    out["graph_reads_new_weights"] = torch.equal(as_bytes(y).cpu(), y1)
    kv.fill_(7)
    out["kv_ok"] = bool(torch.all(kv == 7))
    graph.reset()
    return out
