"""Drop-in replacements for other libraries' offload APIs, built on tagmem.torch.

- ``tagmem.compat.torch_memory_saver``: ``region(tag, enable_cpu_backup)``, ``pause(tag)``,
  ``resume(tag)`` as torch_memory_saver offers them.
- ``tagmem.compat.vllm``: vLLM-style ``sleep(level)`` / ``wake_up(tags)`` and a ``CuMemAllocator``
  with ``use_memory_pool(tag)``, ``sleep(offload_tags)``, ``wake_up(tags)``.

Each needs PyTorch; import the submodule you use.
"""
