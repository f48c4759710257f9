"""``python -m tagmem``: where the installed libraries are, the settings in effect, statistics, and
running a program under the LD_PRELOAD shim.

    python -m tagmem preload-path        # the path of libtagmem_preload.so
    python -m tagmem config              # the libraries found, then every TAGMEM_* setting in effect
    python -m tagmem stats [--device N]  # the device and host figures as a new process sees them
    python -m tagmem run -- CMD ARGS...  # CMD with the shim first on LD_PRELOAD

Nothing here needs PyTorch. ``stats`` initialises tagmem in its own, new process (so it loads the
driver: TAGMEM_LIBCUDA, else libcuda.so.1): the device figures and the metadata heap are those of
this machine and this configuration, but tags live in the process that made them, so its table of
tags is empty. To see a running program's tags, print ``tagmem.stats()`` or
``tagmem.torch.memory_summary()`` in that program, or read its TAGMEM_TRACE file (docs/observe.md);
tagmem opens no channel into a process for others to read.
"""

import argparse
import os
import signal
import sys

from . import _api, _entry_points, _errors, _lib
from . import _preload as _preload_lib

EMU_NAME = "libtagmem_emu.so"
_PACKAGE_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


def _fail(message):
    print(f"tagmem: {message}", file=sys.stderr)
    return 1


def _preload():
    """The shim's absolute path, or an error string (it is missing or its path unusable)."""
    try:
        return _preload_lib.required(), None
    except (_preload_lib.PreloadLibraryNotFound, _preload_lib.PreloadPathError) as e:
        return None, str(e)


def _emulated_driver():
    """The packaged libtagmem_emu.so, else the one beside the loaded libtagmem, else None."""
    candidates = [os.path.join(_PACKAGE_LIB, EMU_NAME)]
    try:
        core = _lib.library_file()
    except _lib.LibraryNotFound:
        core = None
    if core:
        candidates.append(os.path.join(os.path.dirname(core), "driver", "emu", EMU_NAME))
        candidates.append(os.path.join(os.path.dirname(core), EMU_NAME))
    return next((c for c in candidates if os.path.exists(c)), None)


def _library(find):
    try:
        return find()
    except OSError as e:  # LibraryNotFound and the entry points' equivalent
        return f"(not found: {e})"


def preload_path(_args):
    library, problem = _preload()
    if library is None:
        return _fail(problem)
    print(library)
    return 0


def config(_args):
    print("libraries:")
    print(f"  libtagmem               {_library(_lib.library_file)}")
    print(f"  libtagmem_torch_alloc   {_library(_entry_points.path)}")
    print(f"  libtagmem_preload       {_preload_lib.library() or '(not found)'}")
    print(f"  libtagmem_emu           {_emulated_driver() or '(not found)'}")
    # The library's table (options.def) holds every TAGMEM_* setting, this package's included.
    print("settings (name, where the value comes from, value):")
    try:
        described = _api.config_describe()
    except (_lib.LibraryNotFound, _errors.TagmemError) as e:
        return _fail(f"cannot list the settings: {e}")
    for line in described.splitlines():
        print(f"  {line}")
    return 0


def _bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def stats(args):
    try:
        device = _api.stats(device=args.device)
    except (_lib.LibraryNotFound, _errors.TagmemError) as e:
        return _fail(f"cannot read statistics: {e}")
    print(f"process        {os.getpid()} (this command's own: it holds no tags; a program's tags")
    print("               are seen from inside it, with tagmem.stats() or memory_summary())")
    print(f"library        {_lib.library_file()}")
    print(f"metadata heap  {device['metadata_heap']}")
    for key in (
        "device_total_bytes",
        "device_free_bytes",
        "allocated_bytes",
        "reserved_bytes",
        "mapped_bytes",
        "host_pinned_bytes",
        "host_pinned_high_water",
        "host_used_bytes",
        "release_pending_bytes",
    ):
        print(f"{key:<24} {device[key]:>16}  {_bytes(device[key])}")
    print(f"tags: {device['tags']} (of this process)")
    if device["by_tag"]:
        print(f"  {'tag':<24} {'state':<18} {'allocated':>16} {'mapped':>16} {'host':>16}")
    for name, tag in sorted(device["by_tag"].items()):
        print(
            f"  {name:<24} {tag['state']:<18} {tag['allocated_bytes']:>16} "
            f"{tag['mapped_bytes']:>16} {tag['host_bytes']:>16}"
        )
    return 0


def run(args):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        return _fail("run: no command given (python -m tagmem run -- CMD ARGS...)")
    library, problem = _preload()
    if library is None:
        return _fail(problem)
    ld_preload = _preload_lib.with_shim_first(library, os.environ.get("LD_PRELOAD"))
    env = dict(os.environ, LD_PRELOAD=ld_preload)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        return _fail(f"run: cannot start {command[0]!r}: {e}")


def _summary():
    """The docstring's first paragraph as one line: the sentence --help opens with."""
    return " ".join(__doc__.split("\n\n")[0].split()).replace("``", "")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tagmem", description=_summary())
    commands = parser.add_subparsers(dest="subcommand", required=True)
    commands.add_parser("preload-path", help="print the path of libtagmem_preload.so")
    commands.add_parser("config", help="print the libraries found and the TAGMEM_* settings")
    stats_parser = commands.add_parser(
        "stats",
        help="print the device and host figures as a new process sees them (a program's tags are "
        "seen from inside it: tagmem.stats())",
    )
    stats_parser.add_argument("--device", type=int, default=None, help="CUDA device (default: current)")
    run_parser = commands.add_parser("run", help="run a command with the preload shim")
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    handlers = {"preload-path": preload_path, "config": config, "stats": stats, "run": run}
    return handlers[args.subcommand](args)


if __name__ == "__main__":
    # A command-line tool ends quietly when the reader of its output goes away (`| head`), as
    # cat does, instead of Python's BrokenPipeError; `run` execs its command with that default too.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
