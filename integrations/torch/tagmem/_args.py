"""Checking Python arguments before they reach ctypes.

ctypes converts integers and strings without complaint: -1 as a ``c_size_t`` is SIZE_MAX (a
request for all memory), 2**32 as a ``c_int`` is device 0, and a ``c_char_p`` ends a name at its
first NUL, so "a\\0b" would be tag "a". Every value the tag API hands to the C ABI goes through
one of these converters first, which refuse what the C type cannot hold exactly with an
InvalidArgumentError (a ValueError) naming the argument.
"""

import ctypes
import operator

from . import _errors, _lib

SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
INT_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_int) - 1)) - 1
POINTER_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1


def _refuse(message):
    return _errors.error_for(1, message)


def _integer(value, what):
    if isinstance(value, bool):  # an int subclass, but True bytes is a mistake
        raise _refuse(f"{what} must be an integer, not a bool")
    try:
        return operator.index(value)  # int and integer-like (numpy) only, never a float
    except TypeError:
        raise _refuse(f"{what} must be an integer, not {type(value).__name__}") from None


def size(value, what="size"):
    """`value` as a size_t: an integer in [0, SIZE_MAX]."""
    n = _integer(value, what)
    if not 0 <= n <= SIZE_MAX:
        raise _refuse(f"{what} {n} is out of range [0, {SIZE_MAX}]")
    return n


def int32(value, what):
    """`value` as a C int: an integer in [INT_MIN, INT_MAX] (the C ABI checks its range)."""
    n = _integer(value, what)
    if not -INT_MAX - 1 <= n <= INT_MAX:
        raise _refuse(f"{what} {n} is out of range for a C int")
    return n


def device(value):
    """A device for the C ABI: None is the current device, else an ordinal in [0, INT_MAX]."""
    if value is None:
        return _lib.CURRENT_DEVICE
    n = _integer(value, "device")
    if not 0 <= n <= INT_MAX:
        raise _refuse(f"device {n} is out of range [0, {INT_MAX}] (None: the current device)")
    return n


def pointer(value, what):
    """An address or handle for a ``void*`` argument: None (NULL) or an integer in range."""
    if value is None:
        return None
    n = _integer(value, what)
    if not 0 <= n <= POINTER_MAX:
        raise _refuse(f"{what} {n:#x} is not an address" if n >= 0 else f"{what} {n} is negative")
    return n


def name(tag):
    """A tag name as the NUL-terminated bytes the C ABI takes; the C side checks the rest."""
    if not isinstance(tag, str):
        raise _refuse(f"tag name must be a str, not {type(tag).__name__}")
    if "\0" in tag:
        raise _refuse(f"tag name {tag!r} contains a NUL character")
    return tag.encode()
