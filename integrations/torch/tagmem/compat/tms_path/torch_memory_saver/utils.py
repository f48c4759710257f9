"""torch_memory_saver.utils as its callers use it: the path of the preload hook library (under
tagmem, libtagmem_preload.so), and the two helpers torch_memory_saver's own tests import from it
(change_env, is_xpu)."""

import contextlib
import functools
import os

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


@functools.lru_cache(maxsize=1)
def is_xpu():
    """Whether PyTorch runs on an Intel XPU here (tagmem's drop-in supports CUDA only, so its
    callers take their CUDA paths when this is False)."""
    try:
        import torch
    except ImportError:
        return False
    return hasattr(torch, "xpu") and torch.xpu.is_available()


@contextlib.contextmanager
def change_env(key, value):
    """Sets environment variable `key` to `value` inside, and gives it back its earlier value (or
    unsets it) on exit."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
