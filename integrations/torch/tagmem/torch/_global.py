"""Global mode: every CUDA allocation of the process goes through tagmem.

install() makes tagmem PyTorch's current CUDA allocator, and each allocation lands in the calling
thread's tag scope (tagmem.tag / tagmem.torch.tag), "default" outside any scope. Two ways in:

- through libtagmem_libtorch.so (integrations/torch/libtorch, built against this PyTorch), when
  it is found: TAGMEM_LIBTORCH_LIBRARY (``none``: never), else tagmem/lib/libtagmem_libtorch.so
  (setup.py copies it from a build configured with -DTAGMEM_BUILD_LIBTORCH=ON). Its allocator
  tracks tensor.record_stream() (TAGMEM_TORCH_RECORD_STREAMS=off: not), answers
  torch.cuda.memory_stats() and lets torch.cuda.empty_cache() reach tagmem (see
  libtorch/tagmem_libtorch.hpp);
- otherwise through torch.cuda.memory.CUDAPluggableAllocator over libtagmem_torch_alloc.so, which
  needs no build against PyTorch but has none of the three (docs/torch.md lists what remains).

PyTorch can swap its allocator only before it has initialised it, hence the early check.
"""

import ctypes
import os
import threading

import torch

from .. import _entry_points, _errors, _lib

LIBTORCH_NAME = "libtagmem_libtorch.so"

_lock = threading.Lock()
_allocator = None  # kept for the process: PyTorch holds only a raw pointer into it
_through_libtorch = False


def libtorch_library():
    """The path of libtagmem_libtorch.so, or None when none is found (or
    TAGMEM_LIBTORCH_LIBRARY=none asks for the bare pluggable allocator)."""
    env = os.environ.get("TAGMEM_LIBTORCH_LIBRARY")
    if env == "none":
        return None
    if env:
        if not os.path.exists(env):
            raise _errors.error_for(1, f"TAGMEM_LIBTORCH_LIBRARY={env}: no such file")
        return env
    packaged = os.path.join(os.path.dirname(os.path.dirname(__file__)), "lib", LIBTORCH_NAME)
    return packaged if os.path.exists(packaged) else None


def _record_streams():
    value = os.environ.get("TAGMEM_TORCH_RECORD_STREAMS", "on")
    if value not in ("on", "off"):
        raise _errors.error_for(1, f"TAGMEM_TORCH_RECORD_STREAMS={value!r}: expected on or off")
    return 1 if value == "on" else 0


def _install_libtorch(path):
    _lib.lib()  # first, so the library binds to the libtagmem this package uses
    try:
        handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:  # typically built against another PyTorch
        raise _errors.error_for(
            1,
            f"tagmem.torch.install(): {path} could not be loaded ({e}); rebuild it against this "
            "PyTorch, or set TAGMEM_LIBTORCH_LIBRARY=none for the bare pluggable allocator",
        ) from e
    handle.tagmem_libtorch_install.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    handle.tagmem_libtorch_install.restype = ctypes.c_int
    message = ctypes.create_string_buffer(1024)
    status = handle.tagmem_libtorch_install(_record_streams(), message, len(message))
    if status != 0:
        raise _errors.error_for(status, f"tagmem.torch.install() ({path}): {message.value.decode()}")
    return handle


def install():
    """Routes every CUDA allocation of the process through tagmem (global mode).

    Call it before CUDA initialises in PyTorch: before the first CUDA tensor, torch.cuda.init()
    or anything else that initialises CUDA. Raises InvalidArgumentError if it is too late.
    Calling it again is harmless. With libtagmem_libtorch.so found (see the module doc),
    tensor.record_stream(), torch.cuda.memory_stats() and torch.cuda.empty_cache() work
    (full_support() says so); without it they do not (docs/torch.md).
    """
    global _allocator, _through_libtorch
    with _lock:
        if _allocator is not None:
            return
        if torch.cuda.is_initialized():
            raise _errors.error_for(
                1,
                "tagmem.torch.install() must run before CUDA initialises in PyTorch (before the "
                "first CUDA tensor or torch.cuda.init()); PyTorch's allocator is already in use",
            )
        path = libtorch_library()
        if path is not None:
            _allocator = _install_libtorch(path)
            _through_libtorch = True
            return
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


def full_support():
    """Whether global mode runs through libtagmem_libtorch.so, so that tensor.record_stream(),
    torch.cuda.memory_stats() and torch.cuda.empty_cache() work."""
    return _through_libtorch


def joined_frees():
    """How many frees so far waited for streams recorded with tensor.record_stream() (0 without
    libtagmem_libtorch.so)."""
    if not _through_libtorch:
        return 0
    fn = _allocator.tagmem_libtorch_joined_frees
    fn.argtypes, fn.restype = [], ctypes.c_size_t
    return int(fn())
