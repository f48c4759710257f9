"""Global mode: every CUDA allocation of the process goes through tagmem.

install() makes libtagmem_torch_alloc.so's tagmem_torch_alloc / tagmem_torch_free PyTorch's
current CUDA allocator. tagmem's own caching then is the whole allocator, and each allocation lands
in the calling thread's tag scope (tagmem.tag / tagmem.torch.tag), "default" outside any scope.
PyTorch can swap its allocator only before it has initialised it, hence the early check.
"""

import threading

import torch

from .. import _entry_points, _errors

_lock = threading.Lock()
_allocator = None  # kept for the process: PyTorch holds only a raw pointer into it


def install():
    """Routes every CUDA allocation of the process through tagmem (global mode).

    Call it before CUDA initialises in PyTorch: before the first CUDA tensor, torch.cuda.init()
    or anything else that initialises CUDA. Raises InvalidArgumentError if it is too late.
    Calling it again is harmless. Differences from MemPool mode are listed in docs/torch.md
    (torch.cuda.memory_stats() and memory_reserved() raise, torch.cuda.empty_cache() does nothing,
    tensor.record_stream() is not tracked).
    """
    global _allocator
    with _lock:
        if _allocator is not None:
            return
        if torch.cuda.is_initialized():
            raise _errors.error_for(
                1,
                "tagmem.torch.install() must run before CUDA initialises in PyTorch (before the "
                "first CUDA tensor or torch.cuda.init()); PyTorch's allocator is already in use",
            )
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            _entry_points.path(), _entry_points.GLOBAL_ALLOC, _entry_points.FREE
        )
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise _errors.error_for(
                1, f"tagmem.torch.install(): PyTorch refused to change its allocator: {e}"
            ) from e
        _allocator = allocator


def installed():
    """Whether install() has routed the process's CUDA allocations through tagmem."""
    return _allocator is not None
