"""torch_memory_saver.utils as its callers use it: the path of the preload hook library, which
under tagmem is libtagmem_preload.so."""

from tagmem._preload import required as _required


def get_binary_path_from_package(stem):
    """The library for `stem`: tagmem's preload shim for "torch_memory_saver_hook_mode_preload"
    (the torch hook mode needs no library under tagmem), by its absolute path. Raises
    RuntimeError, as torch_memory_saver does, when there is none (tagmem's exception is also a
    FileNotFoundError) or its path would not survive LD_PRELOAD (also a ValueError)."""
    if stem != "torch_memory_saver_hook_mode_preload":
        raise _NoSuchLibrary(f"tagmem's torch_memory_saver has no library {stem!r}")
    return _required()


class _NoSuchLibrary(FileNotFoundError, RuntimeError):
    pass
