"""Tagged memory that other processes map (tagmem_ipc_*, docs/ipc.md); no PyTorch needed.

The exporting process names a range of a tagged allocation with a picklable 64-byte ``IpcHandle``;
a process of the same user and job (TAGMEM_JOB) opens it and maps the same device memory at an
address of its own. A tag whose memory another process has open cannot be offloaded (PeerError
naming that process) until that process closes it; the exporter keeps the allocation alive while
others use it, as with CUDA's legacy IPC.
"""

import ctypes
import threading

from . import _args, _errors, _lib


class IpcHandle:
    """An exported range: 64 opaque bytes, picklable, comparable. It grants nothing by itself: the
    exporter checks the opening process's user, job and identity and the handle's secret."""

    __slots__ = ("data",)

    def __init__(self, data):
        data = bytes(data)
        if len(data) != 64:
            raise _errors.error_for(1, f"an IPC handle is 64 bytes, not {len(data)}")
        self.data = data

    def __reduce__(self):
        return (IpcHandle, (self.data,))

    def __eq__(self, other):
        return isinstance(other, IpcHandle) and other.data == self.data

    def __hash__(self):
        return hash(self.data)

    def __repr__(self):
        return f"IpcHandle({self.data[:8].hex()}...)"

    def _c(self):
        h = _lib.IpcHandle()
        ctypes.memmove(h.bytes, self.data, 64)
        return h


def ipc_export(ptr, nbytes):
    """Exports [ptr, ptr + nbytes), inside one live tagmem allocation of a resident tag. The same
    range exported again gives the same handle."""
    ptr = _args.pointer(ptr, "ptr")
    h = _lib.IpcHandle()
    _errors.check(_lib.lib().tagmem_ipc_export(ptr, _args.size(nbytes, "nbytes"), ctypes.byref(h)))
    return IpcHandle(bytes(h.bytes))


def ipc_unexport(handle):
    """Forgets an export of this process (ranges opened stay mapped until closed)."""
    h = handle._c()
    _errors.check(_lib.lib().tagmem_ipc_unexport(ctypes.byref(h)))


class IpcMapping:
    """Another process's export mapped here: ``ptr``, ``nbytes``, ``device``. ``close()`` (or the
    end of a ``with`` block, or garbage collection) unmaps it; work queued on it must be done."""

    def __init__(self, handle):
        h = handle._c()
        ptr = ctypes.c_void_p()
        nbytes = ctypes.c_size_t()
        device = ctypes.c_int(-1)
        _errors.check(
            _lib.lib().tagmem_ipc_open(
                ctypes.byref(h), ctypes.byref(ptr), ctypes.byref(nbytes), ctypes.byref(device)
            )
        )
        self.handle = handle
        self.ptr = ptr.value
        self.nbytes = nbytes.value
        self.device = device.value
        self._lock = threading.Lock()
        self._open = True

    def close(self):
        with self._lock:
            if not self._open:
                return
            self._open = False
        _errors.check(_lib.lib().tagmem_ipc_close(self.ptr))

    @property
    def closed(self):
        return not self._open

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, or tagmem shut down first: nothing to report to
            pass


def ipc_open(handle):
    """Maps an export of another process (same user, job and GPU): an IpcMapping."""
    if not isinstance(handle, IpcHandle):
        handle = IpcHandle(handle)
    return IpcMapping(handle)


def ipc_stats():
    """This process's IPC figures as a dict (tagmem_ipc_stats)."""
    out = _lib.IpcStats()
    _errors.check(_lib.lib().tagmem_ipc_stats_get_sized(ctypes.byref(out), ctypes.sizeof(out)))
    return {name: getattr(out, name) for name, _ in out._fields_}
