"""tagmem's status codes as Python exceptions.

A failed C call becomes an instance of the class mapped from its tagmem_status, carrying the
status (``.status``, ``.status_name``) and tagmem's message for the calling thread
(tagmem_last_error()). Every class derives from TagmemError, and also from the built-in exception
a Python caller would expect (ValueError for bad arguments, MemoryError for exhausted memory, ...),
so ``except MemoryError`` catches a reload that ran out of device memory.
"""

import builtins

from . import _lib


class TagmemError(RuntimeError):
    """A tagmem call failed. ``status`` is the tagmem_status value, ``status_name`` its name."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = _status_name(status)
        super().__init__(f"{self.status_name}: {message}")


class InvalidArgumentError(TagmemError, ValueError):
    """TAGMEM_ERROR_INVALID_ARGUMENT: bad name, size, mode or device."""


class UnknownTagError(TagmemError, LookupError):
    """TAGMEM_ERROR_UNKNOWN_TAG: no such tag on that device."""


class TagOffloadedError(TagmemError):
    """TAGMEM_ERROR_TAG_OFFLOADED: the operation needs a resident tag."""


class TagResidentError(TagmemError):
    """TAGMEM_ERROR_TAG_RESIDENT: reload of a tag that is resident."""


class UnknownPointerError(TagmemError, LookupError):
    """TAGMEM_ERROR_UNKNOWN_POINTER: not allocated by tagmem, or already freed."""


class OutOfMemoryError(TagmemError, MemoryError):
    """TAGMEM_ERROR_OUT_OF_MEMORY: device memory exhausted."""


class HostOutOfMemoryError(TagmemError, MemoryError):
    """TAGMEM_ERROR_HOST_OUT_OF_MEMORY: pinned host memory exhausted."""


class DriverError(TagmemError):
    """TAGMEM_ERROR_DRIVER: a CUDA driver call failed; the message names it."""


class NoDriverError(TagmemError):
    """TAGMEM_ERROR_NO_DRIVER: libcuda (or TAGMEM_LIBCUDA) could not be loaded."""


class ScopeEmptyError(TagmemError):
    """TAGMEM_ERROR_SCOPE_EMPTY: a tag scope was popped with nothing pushed."""


class PeerError(TagmemError):
    """TAGMEM_ERROR_PEER: a cooperating process failed, disagreed or vanished."""


class TagmemTimeoutError(TagmemError, builtins.TimeoutError):
    """TAGMEM_ERROR_TIMEOUT: a bounded wait ran out."""


class InternalError(TagmemError):
    """TAGMEM_ERROR_INTERNAL: an invariant broke inside tagmem; please report."""


class ForkedError(TagmemError):
    """TAGMEM_ERROR_FORKED: called in a child made by fork() after tagmem started in the parent;
    every call fails so (use tagmem in the parent, or the 'spawn' start method)."""


class DiskIOError(TagmemError, builtins.OSError):
    """TAGMEM_ERROR_IO: a disk backup file could not be made, written or read back whole and
    unchanged (a full disk, an I/O error, a truncated or changed file); the message names it."""


_BY_STATUS = {
    1: InvalidArgumentError,
    2: UnknownTagError,
    3: TagOffloadedError,
    4: TagResidentError,
    5: UnknownPointerError,
    6: OutOfMemoryError,
    7: HostOutOfMemoryError,
    8: DriverError,
    9: NoDriverError,
    10: ScopeEmptyError,
    11: PeerError,
    12: TagmemTimeoutError,
    13: InternalError,
    14: ForkedError,
    15: DiskIOError,
}


def _status_name(status):
    name = _lib.lib().tagmem_status_string(int(status))
    return name.decode() if name else f"TAGMEM_STATUS_{int(status)}"


def error_for(status, message):
    """The exception for a failed status with `message` (no lookup of tagmem_last_error)."""
    return _BY_STATUS.get(int(status), TagmemError)(status, message)


def check(status):
    """Raises the mapped exception, with this thread's tagmem_last_error(), unless `status` is 0.

    Must run on the thread that made the failing call, right after it (the message is
    thread-local and replaced by the thread's next tagmem call).
    """
    if status == 0:
        return
    message = _lib.lib().tagmem_last_error()
    raise error_for(status, message.decode(errors="replace") if message else "")
