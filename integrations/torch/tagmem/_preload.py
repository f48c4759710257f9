"""The LD_PRELOAD shim (libtagmem_preload.so) on a program's LD_PRELOAD: where it is, whether its
path survives the dynamic loader, the LD_PRELOAD value that puts it first, and whether a process
started with it really has it.

Note [a shim that is silently absent]: the dynamic loader splits LD_PRELOAD at every space and
colon and resolves relative entries against the directory of the process it starts; an entry it
cannot open is reported on stderr as "ignored" and the program runs without it, with nothing
else to notice. tagmem would then load another libtagmem copy and put nothing the program
allocates under the shim. So: a shim path with a space or a colon is refused before it reaches
LD_PRELOAD, every path handed on is absolute, and a process whose environment at start named the
shim but that does not have it loaded gets an error at its first tagmem call instead of a
second tagmem (check_honoured(), called by _lib).
"""

import filecmp
import os

PRELOAD_NAME = "libtagmem_preload.so"
# The file name torch_memory_saver's callers compute next to the package directory; tagmem's copy
# of the shim under that name lives in tagmem/compat/tms_path/.
TMS_PRELOAD_NAME = "torch_memory_saver_hook_mode_preload.abi3.so"
TMS_DIRECTORY = "tms_path"
_LOADER_SEPARATORS = (" ", ":")

_PACKAGE_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


class PreloadLibraryNotFound(FileNotFoundError, RuntimeError):
    """No libtagmem_preload.so was found (a RuntimeError too, as torch_memory_saver raises
    when its hook library is missing)."""


class PreloadPathError(ValueError, RuntimeError):
    """The shim's path would not survive LD_PRELOAD (a space or a colon in it)."""


def library():
    """The absolute path of libtagmem_preload.so, or None when none is found: the file named by
    TAGMEM_PRELOAD_LIBRARY (made absolute here, so a child started elsewhere finds it), else
    tagmem/lib/ in the package, else beside the loaded libtagmem."""
    env = os.environ.get("TAGMEM_PRELOAD_LIBRARY")
    if env:
        return os.path.abspath(env) if os.path.exists(env) else None
    packaged = os.path.join(_PACKAGE_LIB, PRELOAD_NAME)
    if os.path.exists(packaged):
        return packaged
    try:
        from . import _lib

        beside = os.path.join(os.path.dirname(_lib.library_file() or ""), PRELOAD_NAME)
    except Exception:  # no libtagmem at all: nothing beside it either
        return None
    return os.path.abspath(beside) if os.path.exists(beside) else None


def checked(path):
    """`path` made absolute, or PreloadPathError when the loader would split it (Note [a shim
    that is silently absent])."""
    path = os.path.abspath(path)
    bad = [c for c in _LOADER_SEPARATORS if c in path]
    if bad:
        raise PreloadPathError(
            f"the preload shim's path {path!r} contains {' and '.join(repr(c) for c in bad)}, "
            "where the dynamic loader splits LD_PRELOAD, so a program would run without it: "
            "install tagmem, or copy libtagmem_preload.so, where the path has neither, and point "
            "TAGMEM_PRELOAD_LIBRARY at it"
        )
    return path


def required():
    """library(), checked; PreloadLibraryNotFound when there is none."""
    path = library()
    if path is None:
        raise PreloadLibraryNotFound(
            f"{PRELOAD_NAME} not found: set TAGMEM_PRELOAD_LIBRARY to its path (a CMake build "
            "has it in integrations/preload/), or install the package from the repository "
            "(pip install --no-build-isolation ./integrations/torch)"
        )
    return checked(path)


def _is_shim(entry, shim):
    """Whether LD_PRELOAD entry `entry` is the shim `shim` itself or a copy of it (the
    package's lib/ and tms_path/ hold two copies of the same file)."""
    try:
        if os.path.samefile(entry, shim):
            return True
        return os.path.getsize(entry) == os.path.getsize(shim) and filecmp.cmp(
            entry, shim, shallow=False
        )
    except OSError:
        return False


def with_shim_first(shim, ld_preload):
    """The LD_PRELOAD value that loads `shim` first and no other copy of it: two copies would
    each interpose the allocations and hold tags of their own."""
    rest = [p for p in (ld_preload or "").split(":") if p and not _is_shim(p, shim)]
    return ":".join([shim] + rest)


def _names_a_shim(entry):
    name = os.path.basename(entry)
    if name == PRELOAD_NAME:
        return True
    return name == TMS_PRELOAD_NAME and os.path.basename(os.path.dirname(entry)) == TMS_DIRECTORY


def _environment_at_start(variable):
    """`variable` as the process's environment had it when it started (what the loader read),
    whatever the process set since; None when unset or unreadable."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    prefix = variable.encode() + b"="
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def unhonoured(shim_loaded):
    """Why this process lacks a shim its LD_PRELOAD named at start, or None: a message when
    `shim_loaded` is False and the environment the loader read named the shim (Note [a shim that
    is silently absent])."""
    if shim_loaded:
        return None
    named = [e for e in (_environment_at_start("LD_PRELOAD") or "").split(":") if _names_a_shim(e)]
    if not named:
        return None
    return (
        f"this process was started with LD_PRELOAD naming {named[0]!r}, but the dynamic loader "
        "did not load it (it splits LD_PRELOAD at spaces and colons, and resolves a relative "
        "path against the directory the process starts in), so tagmem would run without the "
        "shim: give LD_PRELOAD the shim's absolute path, one without spaces or colons (python -m "
        "tagmem run and configure_subprocess() do)"
    )
