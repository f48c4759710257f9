"""A vLLM-shaped worker (tests only): imports the sleep-mode allocator the way vLLM's GPU worker
does and runs weights / KV cache through sleep levels and a weight update."""

import torch
from vllm.device_allocator.cumem import CuMemAllocator


class Worker:
    def __init__(self, weight_bytes, kv_bytes):
        allocator = CuMemAllocator.get_instance()
        with allocator.use_memory_pool(tag="weights"):
            self.weights = torch.randn(weight_bytes // 4, device="cuda")
        with allocator.use_memory_pool(tag="kv_cache"):
            self.kv_cache = torch.zeros(kv_bytes // 4, device="cuda")

    def sleep(self, level=1):
        allocator = CuMemAllocator.get_instance()
        allocator.sleep(offload_tags=("weights",) if level == 1 else tuple())

    def wake_up(self, tags=None):
        CuMemAllocator.get_instance().wake_up(tags)
