"""torch_memory_saver.utils as its callers use it: the path of the preload hook library, which
under tagmem is libtagmem_preload.so."""

from tagmem.compat._tms_env import preload_library


def get_binary_path_from_package(stem):
    """The library for `stem`: tagmem's preload shim for "torch_memory_saver_hook_mode_preload"
    (the torch hook mode needs no library under tagmem)."""
    if stem != "torch_memory_saver_hook_mode_preload":
        raise FileNotFoundError(f"tagmem's torch_memory_saver has no library {stem!r}")
    path = preload_library()
    if path is None:
        raise FileNotFoundError("libtagmem_preload.so not found: set TAGMEM_PRELOAD_LIBRARY")
    return path
