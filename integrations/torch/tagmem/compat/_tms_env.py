"""The torch-free half of the torch_memory_saver drop-in: importing it under its own name, the
preload shim for subprocesses, torch_memory_saver's environment variables.

Note [torch_memory_saver under its own name]: engines write ``import torch_memory_saver``. The
directory ``tms_path`` beside this file holds a package of that name whose ``__init__`` re-exports
``tagmem.compat.torch_memory_saver``. Two things must both hold for it to act:

- ``tms_path`` is on ``sys.path`` (install() puts it first) or on ``PYTHONPATH`` (install() adds it
  there too, so spawned subprocesses, multiprocessing's spawn and Ray workers started from this
  environment inherit it), and
- ``TAGMEM_AS_TORCH_MEMORY_SAVER=1`` is in the environment (install() sets it).

If the directory is on the path but the variable is not 1 (a stale PYTHONPATH), the shim package
steps aside: it removes ``tms_path`` from ``sys.path`` and imports whatever ``torch_memory_saver``
is installed in its place. So the real package is never shadowed by surprise, and no ``.pth``
file is involved. ``python -m tagmem.compat.tms_env`` prints the two variables for a shell.

Preload mode needs libtagmem_preload.so; it is looked up as TAGMEM_PRELOAD_LIBRARY, then
``tagmem/lib/libtagmem_preload.so`` (where setup.py copies a build), then next to the loaded
libtagmem.
"""

import contextlib
import os
import sys
import threading

from .. import _lib, _preload

ENABLE_VARIABLE = "TAGMEM_AS_TORCH_MEMORY_SAVER"
PRELOAD_NAME = _preload.PRELOAD_NAME
TMS_PRELOAD_NAME = _preload.TMS_PRELOAD_NAME

_HERE = os.path.dirname(os.path.abspath(__file__))


def shim_path():
    """The directory that holds the ``torch_memory_saver`` shim package."""
    return os.path.join(_HERE, "tms_path")


def enabled():
    """Whether this environment asks for tagmem under the name torch_memory_saver."""
    return os.environ.get(ENABLE_VARIABLE) == "1"


_install_lock = threading.Lock()
# While installed: (values before the first install(), values the last one left, entries it
# added to PYTHONPATH), so uninstall() gives back exactly what was there (Note [undoing
# install()]).
_installed = None


def _with_entry_first(value, entry):
    # The caller's entries stay as they were, empty ones included (an empty entry is the current
    # directory, which is the caller's choice to make).
    parts = [p for p in value.split(":") if p != entry] if value else []
    return ":".join([entry] + parts)


def _package_parent_needed(parent):
    """Whether children need `parent` (the directory holding tagmem) on PYTHONPATH to import
    tagmem: not when it is this interpreter's site-packages, which its children search anyway
    and which other interpreters, of other Python versions, must not search first."""
    import site

    try:
        searched = set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:  # a virtualenv's old site module
        searched = set()
    return os.path.realpath(parent) not in {os.path.realpath(p) for p in searched}


def install():
    """Makes ``import torch_memory_saver`` give tagmem's drop-in in this process and in every
    subprocess started afterwards from its environment (Note [torch_memory_saver under its own
    name]). Writes nothing to disk. Idempotent; uninstall() undoes it. Raises ImportError when
    another ``torch_memory_saver`` is imported already (install before the engine imports it)."""
    global _installed
    loaded = sys.modules.get("torch_memory_saver")
    if loaded is not None and not getattr(loaded, "__tagmem__", False):
        raise ImportError(
            "a torch_memory_saver other than tagmem's is imported already "
            f"({getattr(loaded, '__file__', loaded)}): call "
            "tagmem.compat.torch_memory_saver.install() before the engine imports it"
        )
    path = shim_path()
    with _install_lock:
        before = {v: os.environ.get(v) for v in (ENABLE_VARIABLE, "PYTHONPATH")}
        added = [] if path in (before["PYTHONPATH"] or "").split(":") else [path]
        os.environ[ENABLE_VARIABLE] = "1"
        pythonpath = _with_entry_first(before["PYTHONPATH"], path)
        # The shim imports tagmem: children must find it where this process did.
        package_parent = os.path.dirname(os.path.dirname(_HERE))
        if package_parent not in pythonpath.split(":") and _package_parent_needed(package_parent):
            pythonpath += ":" + package_parent
            added.append(package_parent)
        os.environ["PYTHONPATH"] = pythonpath
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
        after = {v: os.environ[v] for v in before}
        if _installed is None:
            _installed = (before, after, added)
        else:  # installed again: what the first install found is what uninstall() restores
            _installed = (_installed[0], after, _installed[2] + added)


def uninstall():
    """Undoes install() for this process and later subprocesses (an imported module stays).

    Note [undoing install()]: each variable install() set gets back the exact value it had
    before (unset if it was unset), unless something changed it since; then only the entries
    install() added are taken out of it, and the other changes stay."""
    global _installed
    path = shim_path()
    with _install_lock:
        while path in sys.path:
            sys.path.remove(path)
        installed, _installed = _installed, None
        if installed is None:
            return
        before, after, added = installed
        for variable in before:
            now = os.environ.get(variable)
            if now == after[variable]:
                restored = before[variable]
            elif variable == "PYTHONPATH" and now is not None:
                restored = ":".join(p for p in now.split(":") if p not in added) or None
            else:
                restored = now
            if restored is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = restored


def preload_library():
    """The absolute path of libtagmem_preload.so, or None when none is found."""
    return _preload.library()


def _shim_functions():
    import ctypes

    process = ctypes.CDLL(None)
    if not hasattr(process, _lib.SHIM_SYMBOL):
        return None
    setter = process.tagmem_preload_set_thread_routing
    setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
    routed = process.tagmem_preload_thread_routed
    routed.argtypes, routed.restype = [], ctypes.c_int
    default_tag = process.tagmem_preload_default_tag
    default_tag.argtypes, default_tag.restype = [], ctypes.c_char_p
    return setter, routed, default_tag


_shim = None

# torch_memory_saver's binary_wrapper signatures of the functions the shim exports for it.
_TMS_SIGNATURES = {
    "tms_set_current_tag": (None, ["c_char_p"]),
    "tms_get_current_tag": ("c_char_p", []),
    "tms_set_interesting_region": (None, ["c_bool"]),
    "tms_get_interesting_region": ("c_bool", []),
    "tms_set_enable_cpu_backup": (None, ["c_bool"]),
    "tms_get_enable_cpu_backup": ("c_bool", []),
    "tms_set_cpu_backup_backend": (None, ["c_char_p"]),
    "tms_get_cpu_backup_backend": ("c_char_p", []),
    "tms_set_enable_disk_backup": (None, ["c_bool"]),
    "tms_get_enable_disk_backup": ("c_bool", []),
    "tms_set_disk_backup_dir": (None, ["c_char_p"]),
    "tms_pause": ("c_int", ["c_char_p"]),
    "tms_resume": ("c_int", ["c_char_p"]),
    "set_memory_margin_bytes": (None, ["c_uint64"]),
    "tms_set_retain_cpu_backup": (None, ["c_bool"]),
    "tms_get_retain_cpu_backup": ("c_bool", []),
}


def process_cdll():
    """The process's symbols (ctypes.CDLL(None)): the shim's, the CUDA runtime's when loaded."""
    import ctypes

    return ctypes.CDLL(None)


def shim_tms_functions():
    """The process as a ctypes library whose torch_memory_saver functions (the shim's tms_*) have
    torch_memory_saver's signatures, as its BinaryWrapper sets them; a fresh handle, so callers
    may set other functions' signatures on it."""
    import ctypes

    if not shim_loaded():
        raise RuntimeError("libtagmem_preload.so is not loaded in this process")
    cdll = process_cdll()
    for name, (restype, argtypes) in _TMS_SIGNATURES.items():
        fn = getattr(cdll, name)
        fn.restype = restype and getattr(ctypes, restype)
        fn.argtypes = [getattr(ctypes, a) for a in argtypes]
    byte_pointer = ctypes.POINTER(ctypes.c_uint8)
    cdll.tms_get_cpu_backup_pointer.argtypes = [byte_pointer, ctypes.c_uint64]
    cdll.tms_get_cpu_backup_pointer.restype = byte_pointer
    return cdll


def shim_loaded():
    """Whether libtagmem_preload.so is loaded in this process (preload hook mode works)."""
    global _shim
    if _shim is None:
        _shim = _shim_functions() or False
    return bool(_shim)


ROUTE_AUTO, ROUTE_OFF, ROUTE_ON = -1, 0, 1


def set_thread_routing(mode):
    """Sets this thread's routing in the preload shim (ROUTE_*); returns the previous mode."""
    if not shim_loaded():
        raise RuntimeError("libtagmem_preload.so is not loaded in this process")
    previous = _shim[0](int(mode))
    if previous == -2:
        raise ValueError(f"routing mode {mode!r}: expected ROUTE_AUTO, ROUTE_OFF or ROUTE_ON")
    return previous


def shim_default_tag():
    """The tag the preload shim puts every cudaMalloc outside a tag scope into
    (TAGMEM_PRELOAD_TAG, or "default" under TMS_INIT_ENABLE=1), or None."""
    if not shim_loaded():
        return None
    tag = _shim[2]()
    return tag.decode() if tag else None


def thread_routed():
    """Whether a cudaMalloc of this thread now goes to tagmem (preload shim loaded)."""
    return shim_loaded() and _shim[1]() == 1


@contextlib.contextmanager
def configure_subprocess():
    """Context manager: processes started inside get libtagmem_preload.so first on LD_PRELOAD,
    by its absolute path and as its only copy (and the drop-in's variables, which install()
    already put in the environment). Restores LD_PRELOAD on exit. Raises PreloadLibraryNotFound
    (a FileNotFoundError and RuntimeError) without the shim, PreloadPathError (a ValueError)
    when its path would not survive LD_PRELOAD."""
    with shim_on_ld_preload(_preload.required()):
        yield


@contextlib.contextmanager
def shim_on_ld_preload(library):
    """Context manager: LD_PRELOAD names `library` first, as the only copy of the shim (the path
    checked and made absolute: Note [a shim that is silently absent]); restored on exit."""
    library = _preload.checked(str(library))
    before = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = _preload.with_shim_first(library, before)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before


def flag(name, default=False):
    """torch_memory_saver's boolean variables: "1" or "true" (any case) is true."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value == "1" or value.lower() == "true"
