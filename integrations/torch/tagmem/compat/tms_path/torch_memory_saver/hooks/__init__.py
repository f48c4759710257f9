"""torch_memory_saver.hooks under tagmem: only mode_preload.configure_subprocess is offered."""
