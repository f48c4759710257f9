"""The drop-in compatibility layers on a GPU: tagmem.compat.torch_memory_saver and
tagmem.compat.vllm keep the semantics of the APIs they replace.

Needs PyTorch and a CUDA GPU (gpu_run.sh).
"""

import pytest
import torch

import tagmem
import tagmem.torch as tt
from gpu_support import (
    MiB,
    as_bytes,
    assert_unchanged,
    capture_matmul_relu,
    device_free_bytes,
    snapshot,
)
from tagmem.compat import torch_memory_saver as tms_module
from tagmem.compat import vllm
from tagmem.compat.torch_memory_saver import torch_memory_saver

NOISE = 4 * MiB


def test_torch_memory_saver_region_pause_resume():
    torch.manual_seed(5)
    with torch_memory_saver.region(tag="tms_weights", enable_cpu_backup=True):
        weights = torch.randn(32 * MiB // 4, device="cuda")
    with tms_module.region(tag="tms_kv"):  # module-level form, no backup
        kv = torch.ones(32 * MiB // 4, device="cuda")
    before = snapshot([weights])
    kv_ptr = kv.data_ptr()

    free = device_free_bytes()
    torch_memory_saver.pause("tms_kv")
    assert tt.state("tms_kv") == "offloaded_discard"
    torch_memory_saver.pause()  # every region tag still resident
    assert tt.state("tms_weights") == "offloaded_backup"
    assert device_free_bytes() >= free + 64 * MiB - NOISE
    with pytest.raises(tagmem.TagOffloadedError):
        torch_memory_saver.pause("tms_weights")

    torch_memory_saver.resume()
    assert_unchanged([weights], before)
    assert kv.data_ptr() == kv_ptr
    kv.fill_(7)
    assert torch.all(kv == 7)
    with pytest.raises(tagmem.TagResidentError):
        tms_module.resume("tms_kv")
    torch_memory_saver.pause("never_used")  # as in torch_memory_saver: nothing to pause
    assert not tagmem.exists("never_used", tt.device_index())


def test_torch_memory_saver_cuda_graph_memory_can_be_paused():
    torch.manual_seed(6)
    with torch_memory_saver.region(tag="tms_graph_in", enable_cpu_backup=True):
        w = torch.randn(256, 256, device="cuda")
        x = torch.randn(64, 256, device="cuda")
    graph = torch.cuda.CUDAGraph()
    y = capture_matmul_relu(x, w, torch_memory_saver.cuda_graph(graph, tag="tms_graph"))
    graph.replay()
    torch.cuda.synchronize()
    expected = y.clone()
    assert tagmem.pointer_info(y.data_ptr())["tag"] == "tms_graph"
    torch_memory_saver.pause("tms_graph")
    torch_memory_saver.pause("tms_graph_in")
    torch_memory_saver.resume()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(as_bytes(y), as_bytes(expected))
    graph.reset()


def test_vllm_level_1_keeps_weights_and_drops_the_kv_cache():
    torch.manual_seed(7)
    allocator = vllm.CuMemAllocator.get_instance()
    assert vllm.CuMemAllocator.get_instance() is allocator
    with allocator.use_memory_pool(tag="weights"):
        w = torch.randn(16 * MiB // 4, device="cuda")
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.ones(16 * MiB // 4, device="cuda")
    before = snapshot([w])
    usage = allocator.get_current_usage()
    assert usage >= 32 * MiB

    allocator.sleep(offload_tags=("weights",))
    assert (tt.state("weights"), tt.state("kv_cache")) == ("offloaded_backup", "offloaded_discard")
    assert allocator.get_current_usage() == 0
    allocator.wake_up(tags=["weights"])  # weights first, as during a weight update
    assert_unchanged([w], before)
    assert tt.state("kv_cache") == "offloaded_discard"
    allocator.wake_up()
    kv.zero_()

    vllm.sleep(level=2)
    assert (tt.state("weights"), tt.state("kv_cache")) == ("offloaded_discard", "offloaded_discard")
    vllm.wake_up()
    assert tt.state("weights") == "resident" and tt.state("kv_cache") == "resident"
    w.copy_(before[0][1].cuda())  # level 2: the caller reloads the weights
    assert_unchanged([w], before)

    vllm.sleep(level=1)
    vllm.wake_up(["weights", "kv_cache"])
    assert_unchanged([w], before)
    with pytest.raises(tagmem.InvalidArgumentError):
        vllm.sleep(level=3)
