"""torch_memory_saver.hooks.mode_preload under tagmem."""

from tagmem.compat._tms_env import configure_subprocess  # noqa: F401
