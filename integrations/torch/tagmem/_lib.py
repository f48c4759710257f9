"""Finding and binding tagmem's C ABI (include/tagmem/tagmem.h) with ctypes.

The package never links anything at install time: the first call loads the library, in this
order (Note [one tagmem per process]):

1. the process itself, when it already exports ``tagmem_malloc`` (the LD_PRELOAD shim
   libtagmem_preload.so, or a host program linked with libtagmem);
2. a ``libtagmem.so.1`` loaded already without RTLD_GLOBAL (by an extension module), found by
   its soname without loading anything;
3. the file named by the environment variable ``TAGMEM_LIBRARY``;
4. ``libtagmem.so.1`` inside the package (``tagmem/lib/``, where setup.py copies a build);
5. ``libtagmem.so.1`` on the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig).

Note [one tagmem per process]: tagmem's registry is process state. A second copy of the library
would hold its own tags, so if the process already has tagmem (the preload shim interposes CUDA
allocations into *its* copy) the package must use that one, even when TAGMEM_LIBRARY is set.
The libraries that link libtagmem (libtagmem_torch_alloc.so, libtagmem_libtorch.so) name it by
its soname, libtagmem.so.1, which is also the preload shim's: under the shim the loader gives
them the shim rather than mapping a second copy.

Every foreign call goes through ctypes.CDLL, which releases the GIL for the call's duration, so an
offload that copies gigabytes does not stall other Python threads.
"""

import ctypes
import os
import threading

from . import _preload

MAX_TAG_NAME = 63
CURRENT_DEVICE = -1

_SIZE = ctypes.c_size_t
_U64 = ctypes.c_uint64


class Config(ctypes.Structure):
    """tagmem_config."""

    _fields_ = [
        ("struct_size", _SIZE),
        ("chunk_bytes", _SIZE),
        ("arena_bytes", _SIZE),
        ("copy_piece_bytes", _SIZE),
        ("max_mapping_bytes", _SIZE),
        ("host_max_bytes", _SIZE),
    ]


class TagStats(ctypes.Structure):
    """tagmem_tag_stats."""

    _fields_ = [
        ("state", ctypes.c_int),
        ("allocated_bytes", _SIZE),
        ("requested_bytes", _SIZE),
        ("reserved_bytes", _SIZE),
        ("mapped_bytes", _SIZE),
        ("host_bytes", _SIZE),
        ("virtual_bytes", _SIZE),
        ("live_allocations", _U64),
        ("mappings", _U64),
        ("alloc_count", _U64),
        ("free_count", _U64),
        ("offload_count", _U64),
        ("reload_count", _U64),
        ("bytes_offloaded", _U64),
        ("bytes_reloaded", _U64),
        ("peak_allocated_bytes", _SIZE),
        ("peak_mapped_bytes", _SIZE),
        ("parked_bytes", _SIZE),
    ]


class DeviceStats(ctypes.Structure):
    """tagmem_device_stats."""

    _fields_ = [
        ("allocated_bytes", _SIZE),
        ("reserved_bytes", _SIZE),
        ("mapped_bytes", _SIZE),
        ("device_free_bytes", _SIZE),
        ("device_total_bytes", _SIZE),
        ("host_pinned_bytes", _SIZE),
        ("host_pinned_high_water", _SIZE),
        ("host_used_bytes", _SIZE),
        ("tags", _U64),
        ("release_pending_bytes", _SIZE),
        ("host_budget_bytes", _SIZE),
    ]


class HandoffStats(ctypes.Structure):
    """tagmem_handoff_stats."""

    _fields_ = [
        ("given_bytes", _U64),
        ("given_handles", _U64),
        ("received_bytes", _U64),
        ("received_handles", _U64),
        ("mapped_received_bytes", _U64),
        ("returned_bytes", _U64),
        ("held_bytes", _SIZE),
        ("refused_peers", _U64),
        ("reload_waits", _U64),
        ("reload_wait_timeouts", _U64),
        ("reload_wait_ns", _U64),
        ("listening", ctypes.c_int),
    ]


class IpcHandle(ctypes.Structure):
    """tagmem_ipc_handle."""

    _fields_ = [("bytes", ctypes.c_ubyte * 64)]


class IpcStats(ctypes.Structure):
    """tagmem_ipc_stats."""

    _fields_ = [
        ("exports", _U64),
        ("importers", _U64),
        ("opened_by_peers", _U64),
        ("refused_peers", _U64),
        ("open_here", _U64),
        ("held_allocations", _U64),
        ("held_bytes", _U64),
    ]


_STATUS = ctypes.c_int
_VOIDP = ctypes.c_void_p
_NAMES = ctypes.POINTER(ctypes.c_char_p)
_PROTOTYPES = {
    # The _sized entry points with ctypes.sizeof of the structs above (tagmem.h: the library
    # reads and writes no byte past the size it is given).
    "tagmem_config_init_sized": (None, [ctypes.POINTER(Config), _SIZE]),
    "tagmem_init": (_STATUS, [ctypes.POINTER(Config)]),
    "tagmem_shutdown": (_STATUS, []),
    "tagmem_trace_flush": (_STATUS, []),
    "tagmem_last_error": (ctypes.c_char_p, []),
    "tagmem_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "tagmem_push_tag": (_STATUS, [ctypes.c_char_p]),
    "tagmem_pop_tag": (_STATUS, []),
    "tagmem_current_tag": (ctypes.c_char_p, []),
    "tagmem_malloc": (_STATUS, [ctypes.POINTER(_VOIDP), _SIZE, ctypes.c_int, _VOIDP]),
    "tagmem_malloc_tagged": (
        _STATUS,
        [ctypes.POINTER(_VOIDP), _SIZE, ctypes.c_char_p, ctypes.c_int, _VOIDP],
    ),
    "tagmem_free": (_STATUS, [_VOIDP, _VOIDP]),
    "tagmem_pointer_info": (
        _STATUS,
        [
            _VOIDP,
            ctypes.c_char_p,
            _SIZE,
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(_VOIDP),
            ctypes.POINTER(_SIZE),
        ],
    ),
    "tagmem_offload": (_STATUS, [_NAMES, _SIZE, ctypes.c_int, ctypes.c_int]),
    "tagmem_reload": (_STATUS, [_NAMES, _SIZE, ctypes.c_int]),
    "tagmem_swap": (_STATUS, [_NAMES, _SIZE, _NAMES, _SIZE, ctypes.c_int, ctypes.c_int]),
    "tagmem_empty_cache": (_STATUS, [ctypes.c_int]),
    "tagmem_wait_released": (_STATUS, [ctypes.c_int]),
    "tagmem_release_physical": (_STATUS, [ctypes.c_int]),
    "tagmem_handoff_expect": (_STATUS, [ctypes.c_int, _SIZE]),
    "tagmem_handoff_cancel": (_STATUS, [ctypes.c_int]),
    "tagmem_handoff_stats_get_sized": (
        _STATUS,
        [ctypes.c_int, ctypes.POINTER(HandoffStats), ctypes.c_size_t],
    ),
    "tagmem_ipc_export": (_STATUS, [_VOIDP, _SIZE, ctypes.POINTER(IpcHandle)]),
    "tagmem_ipc_unexport": (_STATUS, [ctypes.POINTER(IpcHandle)]),
    "tagmem_ipc_open": (
        _STATUS,
        [ctypes.POINTER(IpcHandle), ctypes.POINTER(_VOIDP), ctypes.POINTER(_SIZE),
         ctypes.POINTER(ctypes.c_int)],
    ),
    "tagmem_ipc_close": (_STATUS, [_VOIDP]),
    "tagmem_ipc_stats_get_sized": (_STATUS, [ctypes.POINTER(IpcStats), _SIZE]),
    "tagmem_tag_plan_offload": (_STATUS, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "tagmem_host_reserve": (_STATUS, [_SIZE, ctypes.c_int]),
    "tagmem_host_trim": (_STATUS, [_SIZE]),
    "tagmem_tag_stats_get_sized": (
        _STATUS,
        [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(TagStats), _SIZE],
    ),
    "tagmem_device_stats_get_sized": (_STATUS, [ctypes.c_int, ctypes.POINTER(DeviceStats), _SIZE]),
    "tagmem_list_tags": (_STATUS, [ctypes.c_int, _VOIDP, _SIZE, ctypes.POINTER(_SIZE)]),
    "tagmem_host_view": (
        _STATUS,
        [_VOIDP, ctypes.c_int, ctypes.POINTER(_VOIDP), ctypes.POINTER(_SIZE)],
    ),
    "tagmem_set_keep_backup": (_STATUS, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "tagmem_set_unpin_backup": (_STATUS, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "tagmem_set_replicated": (
        _STATUS,
        [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    ),
    "tagmem_set_disk_dir": (_STATUS, [ctypes.c_char_p]),
    "tagmem_set_disk_file_bytes": (_STATUS, [ctypes.c_size_t]),
    "tagmem_set_memory_margin": (None, [_SIZE]),
    "tagmem_memory_margin": (_SIZE, []),
    "tagmem_metadata_heap": (ctypes.c_char_p, []),
    "tagmem_config_describe": (_STATUS, [_VOIDP, _SIZE, ctypes.POINTER(_SIZE)]),
}

_lock = threading.Lock()
_lib = None
_origin = None


class LibraryNotFound(OSError):
    """libtagmem could not be found or loaded; the message lists every place tried."""


SONAME = "libtagmem.so.1"  # the preload shim's soname too
SHIM_SYMBOL = "tagmem_preload_set_thread_routing"  # exported by libtagmem_preload.so only


def _candidates():
    process = ctypes.CDLL(None)
    problem = _preload.unhonoured(hasattr(process, SHIM_SYMBOL))
    if problem:
        raise LibraryNotFound("tagmem: " + problem)
    if hasattr(process, "tagmem_malloc"):
        yield "process", lambda: process
    # A copy loaded already without RTLD_GLOBAL (by an extension module, say) is invisible above:
    # the loader finds it by its soname without loading anything (RTLD_NOLOAD).
    try:
        loaded = ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    except OSError:
        loaded = None
    if loaded is not None:
        yield "loaded", lambda: loaded
        return
    env = os.environ.get("TAGMEM_LIBRARY")
    if env:
        yield env, lambda: ctypes.CDLL(env)
        return  # an explicit choice: no silent fallback to another copy
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libtagmem.so.1")
    if os.path.exists(here):
        yield here, lambda: ctypes.CDLL(here)
    yield SONAME, lambda: ctypes.CDLL(SONAME)


def lib():
    """The bound library (loaded on first use). Raises LibraryNotFound."""
    global _lib, _origin
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for origin, load in _candidates():
            try:
                handle = load()
            except OSError as e:
                tried.append(f"{origin}: {e}")
                continue
            missing = [name for name in _PROTOTYPES if not hasattr(handle, name)]
            if missing:  # another library of that name, or an older libtagmem
                more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
                tried.append(f"{origin}: lacks {missing[0]}{more} (not this version's libtagmem)")
                continue
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib, _origin = handle, origin
            return _lib
        raise LibraryNotFound(
            "tagmem: cannot load libtagmem (set TAGMEM_LIBRARY to its path); tried: "
            + "; ".join(tried)
        )


def origin():
    """Where the library came from: "process", "loaded" (found by its soname, loaded already),
    or the path or name it was loaded by."""
    lib()
    return _origin


def library_file():
    """The file the bound library lives in (resolved through the loaded handle)."""
    handle = lib()
    info = _DlInfo()
    libc = ctypes.CDLL(None)
    dladdr = libc.dladdr
    dladdr.argtypes = [_VOIDP, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    address = ctypes.cast(handle.tagmem_malloc, _VOIDP)
    if dladdr(address, ctypes.byref(info)) == 0 or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", _VOIDP),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", _VOIDP),
    ]
