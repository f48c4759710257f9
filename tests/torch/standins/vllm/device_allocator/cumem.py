"""Stand-in for vLLM's own allocator module: importing it means tagmem's replacement was bypassed."""

raise ImportError("vLLM's own vllm.device_allocator.cumem was imported instead of tagmem's")
