"""torch_memory_saver.hooks.mode_preload under tagmem: configure_subprocess(), which finds the hook
library through this module's get_binary_path_from_package at each call (as torch_memory_saver's
does, so callers and tests that patch that name here are obeyed)."""

import contextlib

from tagmem.compat import _tms_env
from torch_memory_saver.utils import get_binary_path_from_package  # noqa: F401 (patched here)

_STEM = "torch_memory_saver_hook_mode_preload"


@contextlib.contextmanager
def configure_subprocess():
    """Processes started inside get the hook library (tagmem's preload shim) first on LD_PRELOAD,
    as its only copy, the entries already there kept after it; LD_PRELOAD restored on exit."""
    with _tms_env.shim_on_ld_preload(get_binary_path_from_package(_STEM)):
        yield
