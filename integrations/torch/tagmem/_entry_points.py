"""The pluggable-allocator entry-point library (libtagmem_torch_alloc.so) and its slot table.

PyTorch loads the library itself (CUDAPluggableAllocator takes a path and function names); this
module finds that path, binds slots to tags (Note [torch allocator slots] in entry_points.cpp) and
reads the library's failure record. It needs no PyTorch, so it is tested without it.

The library is looked for in this order: the file named by ``TAGMEM_TORCH_LIBRARY``;
``tagmem/lib/`` inside the package; the directory of the libtagmem the package bound; the dynamic
linker's search path. It links libtagmem.so.1, so loading it reuses the process's copy of tagmem
(Note [one tagmem per process] in _lib.py).
"""

import ctypes
import os
import threading

from . import _args, _errors, _lib

LIBRARY_NAME = "libtagmem_torch_alloc.so"
GLOBAL_ALLOC = "tagmem_torch_alloc"
FREE = "tagmem_torch_free"

_lock = threading.RLock()  # slot_for() takes it and calls handle(), which takes it too
_handle = None
_path = None
_slots = {}  # tag name -> slot index


def _candidates():
    env = os.environ.get("TAGMEM_TORCH_LIBRARY")
    if env:
        yield env
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", LIBRARY_NAME)
    if os.path.exists(here):
        yield here
    core = _lib.library_file()
    if core:
        beside = os.path.join(os.path.dirname(core), LIBRARY_NAME)
        if os.path.exists(beside):
            yield beside
    yield LIBRARY_NAME


def handle():
    """The loaded entry-point library (ctypes.CDLL). Raises LibraryNotFound."""
    global _handle, _path
    if _handle is not None:
        return _handle
    with _lock:
        if _handle is not None:
            return _handle
        _lib.lib()  # tagmem first, so the entry points bind to the process's copy
        tried = []
        for path in _candidates():
            try:
                h = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path}: {e}")
                continue
            h.tagmem_torch_bind_slot.restype = ctypes.c_int
            h.tagmem_torch_bind_slot.argtypes = [ctypes.c_int, ctypes.c_char_p]
            h.tagmem_torch_bind_error.restype = ctypes.c_char_p
            h.tagmem_torch_slot_tag.restype = ctypes.c_char_p
            h.tagmem_torch_slot_tag.argtypes = [ctypes.c_int]
            h.tagmem_torch_slot_count.restype = ctypes.c_int
            h.tagmem_torch_failures.restype = ctypes.c_uint64
            h.tagmem_torch_last_failure.restype = ctypes.c_size_t
            h.tagmem_torch_last_failure.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            _handle, _path = h, path
            return h
        raise _lib.LibraryNotFound(
            f"tagmem: cannot load {LIBRARY_NAME} (set TAGMEM_TORCH_LIBRARY to its path); tried: "
            + "; ".join(tried)
        )


def path():
    """The path (or name) the entry-point library was loaded by, as PyTorch must be given it."""
    handle()
    return _path


def slot_function(slot):
    """The exported name of slot `slot`'s allocation function."""
    return f"tagmem_torch_alloc_{int(slot)}"


def slot_for(tag):
    """The slot bound to `tag`, binding the next free slot on first use.

    Slots are never unbound (PyTorch may free through them at any later time), so a process can
    use at most ``slot_count()`` distinct tags in MemPool mode. Raises InvalidArgumentError when
    they are used up or the name is invalid.
    """
    with _lock:
        if tag in _slots:
            return _slots[tag]
        h = handle()
        k = len(_slots)
        if k >= h.tagmem_torch_slot_count():
            raise _errors.error_for(
                1,
                f"tag '{tag}': all {k} MemPool slots are bound (to {sorted(_slots)}); "
                "a process can use that many distinct tags in tagmem.torch's MemPool mode",
            )
        status = h.tagmem_torch_bind_slot(k, _args.name(tag))
        if status != 0:
            raise _errors.error_for(status, h.tagmem_torch_bind_error().decode())
        _slots[tag] = k
        return k


def slot_count():
    """How many slots the library has (64)."""
    return handle().tagmem_torch_slot_count()


def failures():
    """How many allocations and frees through the entry points have failed so far."""
    return handle().tagmem_torch_failures()


def last_failure():
    """The message of the most recent entry-point failure on any thread ("" if none)."""
    h = handle()
    n = h.tagmem_torch_last_failure(None, 0)
    buffer = ctypes.create_string_buffer(n + 1)
    h.tagmem_torch_last_failure(buffer, n + 1)
    return buffer.value.decode(errors="replace")
