"""Stand-in for vllm.device_allocator: the accessor vLLM's workers call for the sleep-mode
allocator, shaped as in vLLM (it imports the allocator module on use)."""


def get_mem_allocator_instance():
    from vllm.device_allocator.cumem import CuMemAllocator

    return CuMemAllocator.get_instance()
