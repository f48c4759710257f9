"""torch_memory_saver.hooks under tagmem: base.HookUtilBase (for patches that subclass it) and
mode_preload.configure_subprocess."""
