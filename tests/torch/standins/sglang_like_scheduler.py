"""An SGLang-shaped scheduler process (tests only): started with the spawn method inside
torch_memory_saver.configure_subprocess(), it uses torch_memory_saver the way SGLang's model
runner and memory pools do and reports what it saw to the parent as a dict."""

import os


def _bytes(t):
    return t.detach().contiguous().reshape(-1).view(__import__("torch").uint8).cpu()


def run(results, nbytes, seed):
    try:
        results.put(_run(nbytes, seed))
    except BaseException as e:  # the parent reports it
        results.put({"error": f"{type(e).__name__}: {e}"})


def _run(nbytes, seed):
    import torch
    import torch_memory_saver
    from torch_memory_saver import torch_memory_saver as saver

    import tagmem
    from gpu_support import capture_matmul_relu  # tests/torch, on the parent's sys.path

    out = {"tagmem": getattr(torch_memory_saver, "__tagmem__", False)}
    out["ld_preload"] = os.environ.get("LD_PRELOAD", "")
    g = torch.Generator(device="cuda").manual_seed(seed)
    with saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.randn(nbytes // 4, device="cuda", generator=g)
    # Read after first use: torch_memory_saver raises AttributeError on reading hook_mode (SGLang
    # only sets it); tagmem's answers once the saver is initialised.
    out["mode"] = saver.hook_mode
    with saver.region(tag="kv_cache"):
        pool = torch.cuda.MemPool()  # SGLang's pools enter their own MemPool inside the region
        with torch.cuda.use_mem_pool(pool):
            kv = torch.zeros(nbytes // 4, device="cuda")
    with saver.disable():
        ordinary = torch.ones(1 << 20, device="cuda")
    with saver.region(tag="weights", enable_cpu_backup=True):
        cdll = saver._impl._binary_wrapper.cdll  # slime's DeepEP patch
        was = cdll.tms_get_interesting_region()
        cdll.tms_set_interesting_region(False)
        shared = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        cdll.tms_set_interesting_region(was)
    x = torch.randn(64, 256, device="cuda", generator=g)
    w = weights[: 256 * 256].view(256, 256)
    graph = torch.cuda.CUDAGraph()
    y = capture_matmul_relu(x, w, saver.cuda_graph(graph, tag="cuda_graph"))
    graph.replay()
    torch.cuda.synchronize()

    def owner(t):
        try:
            return tagmem.pointer_info(t.data_ptr())["tag"]
        except tagmem.UnknownPointerError:
            return None

    out["owners"] = [owner(t) for t in (weights, kv, ordinary, shared, y)]
    expected_w, expected_y = _bytes(weights), _bytes(y)
    free = torch.cuda.mem_get_info()[0]
    for tag in ("kv_cache", "weights", "cuda_graph"):  # paused one by one, as SGLang does
        saver.pause(tag)
    out["freed"] = torch.cuda.mem_get_info()[0] - free
    out["backup_equal"] = torch.equal(saver.get_cpu_backup(weights).view(torch.uint8).reshape(-1),
                                      expected_w)
    view = saver.get_cpu_backup(weights, zero_copy=True)
    out["view_equal"] = torch.equal(view.view(torch.uint8).reshape(-1), expected_w)
    del view
    try:
        saver.pause("weights")
        out["pause_twice"] = "no error"
    except tagmem.TagOffloadedError:
        out["pause_twice"] = "raised"
    saver.resume("weights")  # weights first, updated, then the rest
    out["active_backup"] = saver.get_cpu_backup(weights) is None
    out["weights_equal"] = torch.equal(_bytes(weights), expected_w)
    saver.resume("kv_cache")
    saver.resume("cuda_graph")
    kv.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    out["graph_equal"] = torch.equal(_bytes(y), expected_y)
    out["kv_ok"] = bool(torch.all(kv == 3))
    try:
        saver.resume("kv_cache")
        out["resume_active"] = "no error"
    except tagmem.TagResidentError:
        out["resume_active"] = "raised"
    graph.reset()
    return out
