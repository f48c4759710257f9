"""torch_memory_saver's API over tagmem, for engines written against torch_memory_saver.

Switch with one line before the engine imports torch_memory_saver (or the two environment
variables that ``python -m tagmem.compat.tms_env`` prints, which also reach Ray workers)::

    import tagmem.compat.torch_memory_saver as tms; tms.install()
    from torch_memory_saver import torch_memory_saver        # now tagmem's, in subprocesses too

or import it directly: ``from tagmem.compat.torch_memory_saver import torch_memory_saver``.

Two hook modes, as in torch_memory_saver (``torch_memory_saver.hook_mode = ...`` before first
use; by default "preload" when libtagmem_preload.so is loaded in the process, else "torch"):

- "torch": a region's tensors live in tagmem tag `tag` through PyTorch MemPools
  (tagmem.torch.tag).
- "preload": the process runs under libtagmem_preload.so (configure_subprocess() puts it on
  LD_PRELOAD for processes started inside it). A region opens a fresh MemPool, so PyTorch asks
  the runtime for new segments, and switches the thread's routing on with `tag` as its current
  tag: every cudaMalloc this thread makes inside the region, whichever pool asked, goes to tagmem
  in `tag`. TMS_INIT_ENABLE=1 makes every cudaMalloc of the process pausable (tag "default", or
  the shim's TAGMEM_PRELOAD_TAG when set), TMS_INIT_ENABLE_CPU_BACKUP=1 backs that tag up on
  pause.

A region tag is one tagmem tag per backup wish (the first wish keeps the tag's name, the others
get "+cpu_backup", "+disk_backup" or "+no_backup" appended), as torch_memory_saver decides per
allocation whether and where a pause keeps its bytes. ``pause(tag)`` offloads its tagmem tags
(BACKUP for those of regions that asked for a CPU backup, BACKUP_DISK for a disk backup, to files
in the directory of set_disk_backup_dir() or TMS_DISK_BACKUP_DIR, else DISCARD) and returns once
the memory is back with the driver;
``resume(tag)`` maps them again at the same addresses. Pausing a paused tag or resuming a resident one raises TagOffloadedError /
TagResidentError; a resume that does not fit raises OutOfMemoryError (a MemoryError) with the tag
still paused and its backup intact, so it can be retried. Differences from torch_memory_saver are
listed in docs/torch.md.
"""

import contextlib
import os
import threading
import warnings

from .. import _api, _args, _errors, _lib
from . import _tms_env
from ._tms_env import configure_subprocess, install, uninstall

_TAG_DEFAULT = "default"
# The directory for disk backups when set_disk_backup_dir(), TMS_DISK_BACKUP_DIR and tagmem's own
# TAGMEM_DISK_DIR all name none (torch_memory_saver's default).
_DISK_DIR_DEFAULT = "/tmp"


def _torch():
    import torch  # imported on first use, so the drop-in's torch-free parts import without it

    return torch


def _tt():
    from .. import torch as tt

    return tt


class _Cdll:
    """The torch_memory_saver C functions callers reach through
    ``torch_memory_saver._impl._binary_wrapper.cdll``: the calling thread's region configuration
    (whether its allocations are tracked, into which tag, with a CPU backup or not)."""

    def __init__(self, impl):
        self._impl = impl

    def tms_get_interesting_region(self):
        return self._impl.interesting()

    def tms_set_interesting_region(self, value):
        self._impl.set_interesting(bool(value))

    def tms_get_current_tag(self):
        return self._impl.current_tag().encode()

    def tms_set_current_tag(self, tag):
        self._impl.set_current_tag(tag.decode() if isinstance(tag, bytes) else str(tag))

    def tms_get_enable_cpu_backup(self):
        return self._impl.thread_backup()

    def tms_set_enable_cpu_backup(self, value):
        self._impl.set_thread_backup(bool(value))

    def tms_get_cpu_backup_backend(self):
        return self._impl.thread_backend().encode()

    def tms_set_cpu_backup_backend(self, backend):
        self._impl.set_thread_backend(backend.decode() if isinstance(backend, bytes) else backend)

    def tms_get_enable_disk_backup(self):
        return self._impl.thread_disk()

    def tms_set_enable_disk_backup(self, value):
        self._impl.set_thread_disk(bool(value))

    def tms_set_disk_backup_dir(self, path):
        self._impl.set_disk_dir(path.decode() if isinstance(path, bytes) else str(path))

    def tms_get_retain_cpu_backup(self):
        return self._impl.retain_cpu_backup

    def tms_set_retain_cpu_backup(self, value):
        self._impl.retain_cpu_backup = bool(value)

    def tms_pause(self, tag):
        """0, or the tagmem_status of the failure (as the shim's tms_pause returns)."""
        return _status_of(self._impl.pause, tag)

    def tms_resume(self, tag):
        return _status_of(self._impl.resume, tag)

    def tms_get_cpu_backup_pointer(self, ptr, nbytes):
        """The host address of the CPU copy of [ptr, ptr + nbytes) as a ctypes pointer (NULL when
        there is none or it is not one contiguous piece), as the shim's function answers."""
        import ctypes

        address = ctypes.cast(ptr, ctypes.c_void_p).value if not isinstance(ptr, int) else ptr
        try:
            pieces = _api.host_pieces(address, int(nbytes))
        except _errors.TagmemError:
            pieces = []
        host = pieces[0][0] if len(pieces) == 1 else None
        return ctypes.cast(host, ctypes.POINTER(ctypes.c_uint8))

    def set_memory_margin_bytes(self, value):
        _api.set_memory_margin(value)

    def __getattr__(self, name):
        # Other symbols of the process (the CUDA runtime's, say), as torch_memory_saver's cdll,
        # a loaded library, resolves them through its dependencies.
        return getattr(_tms_env.process_cdll(), name)


def _status_of(call, tag):
    if isinstance(tag, bytes):
        tag = tag.decode()
    try:
        call(tag or None)
    except _errors.TagmemError as e:
        return e.status
    return 0


class _BinaryWrapper:
    """torch_memory_saver's BinaryWrapper: ``cdll`` and ``set_config``. In preload mode ``cdll`` is
    the process, whose tms_* functions the shim exports (with torch_memory_saver's signatures);
    in torch mode an object answering the same calls."""

    def __init__(self, impl):
        self.cdll = _tms_env.shim_tms_functions() if impl.hook_mode == "preload" else _Cdll(impl)

    def set_config(
        self,
        *,
        tag,
        interesting_region,
        enable_cpu_backup,
        cpu_backup_backend=None,
        enable_disk_backup=False,
    ):
        """Sets the calling thread's region configuration, as torch_memory_saver's does, in its
        order (the disk wish last): each value on its own (a backend may be named while backup is
        off, as a region's exit restores the thread's earlier configuration); only the names are
        checked."""
        if cpu_backup_backend is not None:
            _check_backend(cpu_backup_backend)
        _args.name(tag)  # checked as every tag name, before anything changes
        self.cdll.tms_set_current_tag(tag.encode())
        self.cdll.tms_set_interesting_region(interesting_region)
        self.cdll.tms_set_enable_cpu_backup(enable_cpu_backup)
        if cpu_backup_backend is not None:
            self.cdll.tms_set_cpu_backup_backend(cpu_backup_backend.encode())
        self.cdll.tms_set_enable_disk_backup(bool(enable_disk_backup))


# The name suffix of each backup wish's tagmem tag when the tag's own name went to another wish.
_SUFFIXES = {"cpu": "+cpu_backup", "disk": "+disk_backup", "none": "+no_backup"}


def _wish(cpu, disk):
    """A region's backup wish: "cpu", "disk" or "none" (a CPU backup wins over a disk one, which
    the API refuses together anyway)."""
    return "cpu" if cpu else "disk" if disk else "none"


class _BackupRecord:
    """The tagmem tags of the region tags, process-wide, shared by every TorchMemorySaver.

    torch_memory_saver decides per allocation whether and where a pause keeps its bytes, tagmem
    per tag: a region tag is one tagmem tag per backup wish (a CPU copy, a disk copy, none). The
    wish it is first opened with gets the tag's own name, the others the name with "+cpu_backup",
    "+disk_backup" or "+no_backup" appended (the preload shim's tms_* functions name them the same
    way), so a tag always used one way keeps its name."""

    def __init__(self):
        self._lock = threading.Lock()
        self._records = {}  # tagmem tag -> [region tag, wish, reclaim], in first-use order

    def _variant(self, tag, wish):
        for name, (owner, wants, _) in self._records.items():
            if owner == tag and wants == wish:
                return name
        held = self._records.get(tag)
        if held is not None and held[1] != wish:
            return tag + _SUFFIXES[wish]
        return tag

    def note(self, tag, backup, backend="pinned", disk=False):
        """Records a region of `tag` with a CPU backup wish `backup` (or a disk one, `disk`);
        returns its tagmem tag. With a CPU backup, `backend` "mmap" makes resumes that keep no
        copy give host memory back."""
        wish = _wish(backup, disk)
        with self._lock:
            name = self._variant(tag, wish)
            self._records[name] = [tag, wish, wish == "cpu" and backend == "mmap"]
            return name

    def names(self, tag=None):
        """The tagmem tags of region tag `tag` (None: of every region tag)."""
        with self._lock:
            return [n for n, r in self._records.items() if tag is None or r[0] == tag]

    def mode(self, name):
        """How tagmem tag `name` is offloaded on pause: BACKUP, BACKUP_DISK or DISCARD."""
        with self._lock:
            wish = self._records.get(name, (None, "none", False))[1]
        return {"cpu": _api.BACKUP, "disk": _api.DISK}.get(wish, _api.DISCARD)

    def wants(self, name):
        """Whether tagmem tag `name` keeps its bytes in host memory when paused."""
        return self.mode(name) == _api.BACKUP

    def reclaims(self, name):
        """Whether a resume of tagmem tag `name` that keeps no copy gives host memory back."""
        with self._lock:
            return self._records.get(name, (None, "none", False))[2]

    def tags(self):
        return self.names()


_backups = _BackupRecord()
_init_lock = threading.Lock()  # one _Impl per TorchMemorySaver, however many first calls race


class _Impl:
    """The initialised state behind TorchMemorySaver (created on first use).

    Preload mode: the thread's region configuration, the record of which tags are paused with a
    backup, pause and resume live in the shim (its tms_* functions, reached through
    ``_binary_wrapper.cdll`` as in torch_memory_saver), so C callers of those functions and this
    class see one state. Torch mode: they live here."""

    def __init__(self, hook_mode=None):
        if hook_mode is None:
            hook_mode = "preload" if _tms_env.shim_loaded() else "torch"
        if hook_mode not in ("preload", "torch"):
            raise ValueError(f"hook_mode {hook_mode!r}: expected 'preload' or 'torch'")
        if hook_mode == "preload" and not _tms_env.shim_loaded():
            raise RuntimeError(
                "hook_mode='preload' needs libtagmem_preload.so in this process: start it inside "
                "torch_memory_saver.configure_subprocess(), or with LD_PRELOAD set to the shim"
            )
        self.hook_mode = hook_mode
        # Consulted at each resume, as torch_memory_saver does: a resume with it on keeps the
        # host copy of the tags it brings back (tagmem_set_keep_backup).
        self._retain = _tms_env.flag("TMS_RETAIN_CPU_BACKUP")
        self._binary_wrapper = _BinaryWrapper(self)
        self._lock = threading.Lock()
        # The MemPool of each region configuration, under torch_memory_saver's key (tag,
        # enable_cpu_backup, enable_disk_backup, resolved backend or "", device), as callers that
        # release a region's pool read it. Preload mode: a fresh pool (module doc); torch mode: the
        # pool of the region's tagmem tag.
        self._mem_pools = {}
        self._local = threading.local()  # torch mode: depth, off, backup, backend, disk
        # Torch mode: whether a directory for disk backups was set (the shim keeps its own).
        self._disk_dir_set = False
        if hook_mode == "torch" and os.environ.get("TMS_DISK_BACKUP_DIR"):
            self.set_disk_dir(os.environ["TMS_DISK_BACKUP_DIR"])
        if _tms_env.flag("TMS_INIT_ENABLE"):
            if hook_mode == "preload":
                # The tag the shim routes every cudaMalloc to: "default", or TAGMEM_PRELOAD_TAG.
                tag = _tms_env.shim_default_tag() or _TAG_DEFAULT
                self._note(
                    tag,
                    _tms_env.flag("TMS_INIT_ENABLE_CPU_BACKUP"),
                    self.thread_backend(),
                    _tms_env.flag("TMS_INIT_ENABLE_DISK_BACKUP"),
                )
            else:
                warnings.warn("TMS_INIT_ENABLE=1 only works in hook_mode='preload'; ignored")

    @property
    def _cdll(self):
        return self._binary_wrapper.cdll

    @property
    def retain_cpu_backup(self):
        if self.hook_mode == "preload":
            return bool(self._cdll.tms_get_retain_cpu_backup())
        return self._retain

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        if self.hook_mode == "preload":
            self._cdll.tms_set_retain_cpu_backup(bool(value))
        self._retain = bool(value)

    # ---- region tracking ----------------------------------------------------------------------

    def interesting(self):
        if self.hook_mode == "preload":
            return bool(self._cdll.tms_get_interesting_region())
        return getattr(self._local, "depth", 0) > 0 and not getattr(self._local, "off", False)

    def set_interesting(self, value):
        if self.hook_mode == "preload":
            self._cdll.tms_set_interesting_region(bool(value))
        else:
            self._local.off = not value

    def current_tag(self):
        """The tag this thread's tracked allocations go to ("default" before any is set)."""
        if self.hook_mode == "preload":
            return self._cdll.tms_get_current_tag().decode()
        return getattr(self._local, "tag", None) or _TAG_DEFAULT

    def set_current_tag(self, tag):
        _args.name(tag)  # checked as every tag name
        if self.hook_mode == "preload":
            self._cdll.tms_set_current_tag(tag.encode())
        else:
            self._local.tag = None if tag == _TAG_DEFAULT else tag

    def thread_backup(self):
        if self.hook_mode == "preload":
            return bool(self._cdll.tms_get_enable_cpu_backup())
        return getattr(self._local, "backup", False)

    def set_thread_backup(self, value):
        if self.hook_mode == "preload":
            self._cdll.tms_set_enable_cpu_backup(bool(value))
            return
        self._local.backup = value
        if value:
            self._note(self.current_tag(), True, self.thread_backend())

    def thread_disk(self):
        """Whether this thread's regions back up to disk (at start TMS_INIT_ENABLE_DISK_BACKUP)."""
        if self.hook_mode == "preload":
            return bool(self._cdll.tms_get_enable_disk_backup())
        disk = getattr(self._local, "disk", None)
        if disk is None:
            disk = self._local.disk = _tms_env.flag("TMS_INIT_ENABLE_DISK_BACKUP")
        return disk

    def set_thread_disk(self, value):
        if self.hook_mode == "preload":
            self._cdll.tms_set_enable_disk_backup(bool(value))
            return
        self._local.disk = bool(value)
        if value and not self.thread_backup():
            self._note(self.current_tag(), False, disk=True)

    def set_disk_dir(self, path):
        """The directory disk backups are written to, process-wide (created when missing)."""
        if self.hook_mode == "preload":
            self._cdll.tms_set_disk_backup_dir(path.encode())
            return
        os.makedirs(path, exist_ok=True)
        _api.set_disk_dir(path)
        self._disk_dir_set = True

    def _ensure_disk_dir(self):
        # torch_memory_saver writes to /tmp when no directory was named; tagmem's own setting
        # comes first.
        if not self._disk_dir_set and not os.environ.get("TAGMEM_DISK_DIR"):
            self.set_disk_dir(_DISK_DIR_DEFAULT)

    def thread_backend(self):
        """The CPU backup backend of this thread's regions: "pinned" or "mmap" (at start
        TMS_INIT_CPU_BACKUP_BACKEND, else "pinned")."""
        if self.hook_mode == "preload":
            return self._cdll.tms_get_cpu_backup_backend().decode()
        backend = getattr(self._local, "backend", None)
        if backend is None:
            backend = self._local.backend = _env_backend()
        return backend

    def set_thread_backend(self, backend):
        _check_backend(backend)
        if self.hook_mode == "preload":
            self._cdll.tms_set_cpu_backup_backend(backend.encode())
        else:
            self._local.backend = backend

    def _note(self, tag, backup, backend="pinned", disk=False):
        """Records a region of `tag`; returns the tagmem tag its allocations go to."""
        name = _backups.note(tag, backup, backend, disk)
        # A region with a CPU backup is pinned ahead as it grows (tagmem_tag_plan_offload), except
        # with the "mmap" backend, whose promise is host memory only while the tag is paused.
        backup_ahead = _backups.wants(name) and not _backups.reclaims(name)
        _api.plan_offload(name, _api.BACKUP if backup_ahead else _api.DISCARD)
        # From its first pause on, an "mmap" backup lies in host memory of its own, which its
        # resume can give back without touching what the other regions keep pinned.
        _api.set_unpin_backup(name, _backups.wants(name) and _backups.reclaims(name))
        return name

    def _pool(self, key, make):
        with self._lock:
            pool = self._mem_pools.get(key)
            if pool is None:
                pool = self._mem_pools[key] = make()
            return pool

    @contextlib.contextmanager
    def _with_region_config(
        self, tag, enable_cpu_backup, cpu_backup_backend=None, enable_disk_backup=False
    ):
        """Preload mode: the calling thread's configuration inside a region (its allocations go
        to tagmem, into `tag`), restored on exit. Under this name and signature, as in
        torch_memory_saver, because callers replace it on the class or call it (slime's nested
        regions set their own through _binary_wrapper.set_config)."""
        _check_backup_args(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        wrapper = self._binary_wrapper
        # Torch mode: outside a region interesting() is False, and setting that back would switch
        # the thread's region tracking off (disable()'s switch) for every later region; the switch
        # itself is what is restored.
        tracking_off = getattr(self._local, "off", False)
        saved = dict(
            tag=self.current_tag(),
            interesting_region=self.interesting(),
            enable_cpu_backup=self.thread_backup(),
            cpu_backup_backend=self.thread_backend(),
            enable_disk_backup=self.thread_disk(),
        )
        wrapper.set_config(
            tag=tag,
            interesting_region=True,
            enable_cpu_backup=enable_cpu_backup,
            cpu_backup_backend=cpu_backup_backend,
            enable_disk_backup=enable_disk_backup,
        )
        try:
            yield
        finally:
            wrapper.set_config(**saved)
            if self.hook_mode != "preload":
                self._local.off = tracking_off

    @contextlib.contextmanager
    def region(self, tag, enable_cpu_backup, cpu_backup_backend=None, enable_disk_backup=False):
        backend = (cpu_backup_backend or self.thread_backend()) if enable_cpu_backup else ""
        disk = bool(enable_disk_backup)
        key = (tag, bool(enable_cpu_backup), disk, backend, _torch().cuda.current_device())
        if self.hook_mode == "preload":
            # The shim names and plans the region's tagmem tag (tms_set_enable_cpu_backup, then
            # tms_set_enable_disk_backup).
            pool = self._pool(key, _torch().cuda.MemPool)
            with _torch().cuda.use_mem_pool(pool), self._with_region_config(
                tag=tag,
                enable_cpu_backup=enable_cpu_backup,
                **_backend_kwargs(cpu_backup_backend),
                **({"enable_disk_backup": True} if disk else {}),
            ):
                yield
            return
        if getattr(self._local, "off", False):  # region tracking switched off on this thread
            yield
            return
        name = self._note(tag, enable_cpu_backup, backend, disk)
        # The region's own pool, held only under its key, as torch_memory_saver holds it: a caller
        # that drops it and empties PyTorch's cache frees its segments in tagmem, and with them
        # their host copies (Note [a freed allocation's host copy], allocator/tags).
        pool = self._pool(key, lambda: _tt().new_pool(name))
        with _tt().tag(name, pool=pool):
            self._local.depth = getattr(self._local, "depth", 0) + 1
            try:
                yield
            finally:
                self._local.depth -= 1

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph,
        pool,
        stream,
        capture_error_mode,
        tag,
        enable_cpu_backup,
        cpu_backup_backend=None,
    ):
        # A paused tag's pool still lists its cached blocks: a capture would be handed memory
        # that is not mapped, and any new segment would fail inside PyTorch's capture. Refused
        # before the capture starts, with what to do.
        device = _torch().cuda.current_device()
        names = {tag, *(tag + suffix for suffix in _SUFFIXES.values()), *_backups.names(tag)}
        if any(_api.exists(n, device) and _api.state(n, device) != "resident" for n in names):
            raise _errors.error_for(
                3, f"torch_memory_saver.cuda_graph: tag '{tag}' is paused; resume('{tag}') first"
            )
        backend = (cpu_backup_backend or self.thread_backend()) if enable_cpu_backup else ""
        if self.hook_mode == "preload":
            with _torch().cuda.graph(
                cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode
            ), self._with_region_config(
                tag=tag, enable_cpu_backup=enable_cpu_backup, **_backend_kwargs(cpu_backup_backend)
            ):
                yield
            return
        name = self._note(tag, enable_cpu_backup, backend)
        if pool is None:  # a pool passed in is a graph's earlier pool(), hence the tag's
            pool = _tt().pool(name).id
        with _torch().cuda.graph(
            cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode
        ):
            yield

    @contextlib.contextmanager
    def disable(self):
        # A fresh pool of PyTorch's own allocator, with tracking off: ordinary memory.
        if self.hook_mode == "preload":
            previous = _tms_env.set_thread_routing(_tms_env.ROUTE_OFF)
        else:
            previous = getattr(self._local, "off", False)
            self._local.off = True
        try:
            pool = _torch().cuda.MemPool()
            with _torch().cuda.use_mem_pool(pool):
                yield
            del pool
        finally:
            if self.hook_mode == "preload":
                _tms_env.set_thread_routing(previous)
            else:
                self._local.off = previous

    # ---- pause and resume ---------------------------------------------------------------------

    def _present(self, tag):
        """[(device, {tagmem tag: state})] of the tagmem tags of region tag `tag` (None: of every
        region tag) that exist, per device."""
        known = _backups.names(tag) or ([] if tag is None else [tag])
        out = []
        for d in range(_torch().cuda.device_count()):
            here = set(_api.tags(d))
            states = {n: _api.state(n, d) for n in known if n in here}
            if states:
                out.append((d, states))
        return out

    def _shim_call(self, what, tag):
        """Preload mode: the shim's tms_pause / tms_resume, its status raised as tagmem's
        exception."""
        status = getattr(self._cdll, f"tms_{what}")(tag.encode() if tag else None)
        if status == 3:
            raise _errors.error_for(3, f"torch_memory_saver.pause: tag '{tag}' is paused already")
        if status == 4:
            raise _errors.error_for(4, f"torch_memory_saver.resume: tag '{tag}' is not paused")
        _errors.check(status)

    def pause(self, tag):
        if self.hook_mode == "preload":
            for d in range(_torch().cuda.device_count()):
                _torch().cuda.synchronize(d)
            self._shim_call("pause", tag)
            return
        work = []
        for d, states in self._present(tag):
            names = [n for n, state in states.items() if state == "resident"]
            if tag is not None and not names:
                raise _errors.error_for(3, f"torch_memory_saver.pause: tag '{tag}' is paused already")
            work.append((d, names))
        for d, names in work:
            _torch().cuda.synchronize(d)
            # What has no copy first (Note [drop before copying]), so that its memory is free
            # at once, also with the copies of an early return still to run.
            for mode in (_api.DISCARD, _api.BACKUP, _api.DISK):
                group = [n for n in names if _backups.mode(n) == mode]
                if group:
                    if mode == _api.DISK:
                        self._ensure_disk_dir()
                    _api.offload(group, mode, d)
            if not _api.offload_returns_early():  # else the copies run on after pause returns
                _api.wait_released(d)

    def resume(self, tag):
        if self.hook_mode == "preload":
            self._shim_call("resume", tag)
            return
        work = []
        for d, states in self._present(tag):
            names = [n for n, state in states.items() if state != "resident"]
            if tag is not None and not names:
                raise _errors.error_for(4, f"torch_memory_saver.resume: tag '{tag}' is not paused")
            work.append((d, names))
        for d, names in work:
            for n in names:
                if _backups.wants(n):
                    _api.set_keep_backup(n, self._retain, d)
                    # The "mmap" backend's promise: its host memory goes back after the resume;
                    # the other regions keep theirs pinned for their next pause.
                    _api.set_unpin_backup(n, _backups.reclaims(n) and not self._retain, d)
            if names:
                _api.reload(names, d)

    def get_cpu_backup(self, x, zero_copy):
        if not x.is_cuda or not x.is_contiguous():
            raise ValueError("get_cpu_backup needs a contiguous CUDA tensor")
        try:
            owner = _api.pointer_info(x.data_ptr())
        except _errors.UnknownPointerError:
            raise ValueError(
                "get_cpu_backup: the tensor was not created in a torch_memory_saver region"
            ) from None
        state = _api.state(owner["tag"], owner["device"])
        if state == "offloaded_discard":
            raise _errors.error_for(
                3,
                f"get_cpu_backup: tag '{owner['tag']}' is paused without a CPU backup "
                "(open its region with enable_cpu_backup=True)",
            )
        if state == "offloaded_disk":
            return None  # as torch_memory_saver: a disk backup has no copy in host memory
        if state == "resident":
            return _kept_backup(x, zero_copy)
        if zero_copy and len(_api.host_pieces(x.data_ptr(), x.numel() * x.element_size())) == 1:
            return _tt().host_tensor(x, copy=False)
        # A backup that lies in several host pieces has no single view: callers get its bytes
        # as a copy, which is what they read either way.
        return _tt().host_tensor(x, copy=True)


def _backend_kwargs(cpu_backup_backend):
    # Passed only when given: patches in the wild replace _with_region_config with a function of
    # (self, tag, enable_cpu_backup) alone (slime's nested regions).
    return {} if cpu_backup_backend is None else {"cpu_backup_backend": cpu_backup_backend}


def _kept_backup(x, zero_copy):
    """The backup a retaining resume kept for active `x` (its bytes at the last pause), or None
    when there is none (never retained, or the tag allocated or freed since)."""
    try:
        pieces = _api.host_pieces(x.data_ptr(), x.numel() * x.element_size())
    except _errors.TagResidentError:
        return None
    return _tt().tensor_over_pieces(pieces, x, copy=not (zero_copy and len(pieces) == 1))


class TorchMemorySaver:
    """torch_memory_saver's TorchMemorySaver over tagmem (use the module's singleton)."""

    def __init__(self):
        self._impl_ctor_kwargs = {}
        self._impl = None

    def _ensure_initialized(self):
        # Callers use self._impl after calling this (patches in the wild replace it with one
        # that returns None, as torch_memory_saver's does); it also returns the implementation.
        impl = self._impl
        if impl is not None:
            return impl
        with _init_lock:
            if self._impl is None:
                self._impl = _Impl(**self._impl_ctor_kwargs)
                # Deleted, as torch_memory_saver does: patches in the wild test
                # hasattr(saver, "_impl_ctor_kwargs") to know whether it may still be configured.
                del self._impl_ctor_kwargs
            return self._impl

    @contextlib.contextmanager
    def region(
        self,
        tag=_TAG_DEFAULT,
        enable_cpu_backup=False,
        enable_disk_backup=False,
        cpu_backup_backend=None,
    ):
        """Context manager: CUDA memory allocated inside is pausable under `tag` (module doc)."""
        _check_backup_args(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        self._ensure_initialized()
        with self._impl.region(tag, enable_cpu_backup, cpu_backup_backend, enable_disk_backup):
            yield

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph,
        pool=None,
        stream=None,
        capture_error_mode="global",
        tag=_TAG_DEFAULT,
        enable_cpu_backup=False,
        cpu_backup_backend=None,
    ):
        """``_torch().cuda.graph(...)`` whose private memory is pausable under `tag` (replaying
        the graph needs ``resume(tag)`` first)."""
        _check_backup_args(enable_cpu_backup, False, cpu_backup_backend)
        self._ensure_initialized()
        with self._impl.cuda_graph(
            cuda_graph, pool, stream, capture_error_mode, tag, enable_cpu_backup, cpu_backup_backend
        ):
            yield

    @contextlib.contextmanager
    def disable(self):
        """Context manager: allocations inside are ordinary PyTorch memory, never paused."""
        self._ensure_initialized()
        with self._impl.disable():
            yield

    def pause(self, tag=None):
        """Releases the device memory of `tag` (None: every region tag that is resident); it is
        back with the driver when this returns."""
        self._ensure_initialized()
        self._impl.pause(tag)

    def resume(self, tag=None):
        """Maps `tag` again at its old addresses (None: every paused region tag)."""
        self._ensure_initialized()
        self._impl.resume(tag)

    @property
    def enabled(self):
        """Always True: tagmem is available whenever this module imports."""
        return True

    @property
    def hook_mode(self):
        """The hook mode in use ("preload" or "torch") once initialised. Reading it initialises
        nothing: before first use it raises AttributeError, as torch_memory_saver's does."""
        impl = self._impl
        if impl is None:
            raise AttributeError(
                "torch_memory_saver.hook_mode is known only after first use (set it, or use the "
                "saver first)"
            )
        return impl.hook_mode

    @hook_mode.setter
    def hook_mode(self, hook_mode):
        if self._impl is not None:
            raise _TooLate("torch_memory_saver.hook_mode must be set before first use")
        # Stored as given, checked at first use, as torch_memory_saver does: patches add modes of
        # their own and read this value back from _impl_ctor_kwargs.
        self._impl_ctor_kwargs["hook_mode"] = hook_mode

    @property
    def memory_margin_bytes(self):
        """The free-memory margin (tagmem.memory_margin())."""
        return _api.memory_margin()

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        self._ensure_initialized()
        _api.set_memory_margin(value)

    @property
    def retain_cpu_backup(self):
        """Whether a resume keeps the pinned host copy of the CPU-backed-up tags it brings back
        (TMS_RETAIN_CPU_BACKUP=1 sets it at start). A kept copy holds the bytes of the last pause;
        get_cpu_backup() returns it while the tensor is active, until its tag is paused again
        (which writes a fresh copy), resumed without retention, or allocates or frees. Setting
        it to False gives no copy back by itself: the next non-retaining resume does."""
        self._ensure_initialized()
        return self._impl.retain_cpu_backup

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        self._ensure_initialized()
        self._impl.retain_cpu_backup = bool(value)

    def get_cpu_backup(self, x, zero_copy=False):
        """A CPU tensor of `x`'s bytes while its tag is paused with a CPU backup (zero_copy=True:
        a view of the pinned backup itself, valid until resume); while `x` is active, the copy a
        retaining resume kept (a snapshot of the last pause; zero_copy: a view, read-only by
        contract, valid until the tag is paused or resumed again) or None when there is none.
        Raises TagOffloadedError when the tag was paused without a backup."""
        self._ensure_initialized()
        return self._impl.get_cpu_backup(x, zero_copy)

    def set_disk_backup_dir(self, path):
        """The directory (created when missing) that pauses write the disk backups of
        ``region(enable_disk_backup=True)`` to, process-wide; before it, TMS_DISK_BACKUP_DIR,
        else TAGMEM_DISK_DIR, else /tmp. Use a real disk: on tmpfs the files are host memory."""
        self._ensure_initialized()
        os.makedirs(path, exist_ok=True)
        self._impl._binary_wrapper.cdll.tms_set_disk_backup_dir(str(path).encode())


class _TooLate(RuntimeError, AttributeError):
    """Configuring after first use: torch_memory_saver raises AttributeError there (its
    _impl_ctor_kwargs is gone), tagmem's message says why."""


def _check_backup_args(enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
    if enable_disk_backup and enable_cpu_backup:
        raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
    if cpu_backup_backend is not None:
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        _check_backend(cpu_backup_backend)


_BACKENDS = ("pinned", "mmap")


def _check_backend(backend):
    """torch_memory_saver's CPU backup backends. Both back up to pinned host memory; "mmap" adds
    its promise that host memory is given back after a resume that keeps no copy (the region's
    backup is unpinned then, tagmem_set_unpin_backup; the other regions keep theirs: docs/torch.md)."""
    if backend not in _BACKENDS:
        raise ValueError(f"cpu_backup_backend={backend!r}: expected 'pinned' or 'mmap'")


def _env_backend():
    backend = os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
    return backend if backend in _BACKENDS else "pinned"


torch_memory_saver = TorchMemorySaver()


def region(tag=_TAG_DEFAULT, enable_cpu_backup=False):
    """torch_memory_saver.region (module-level form)."""
    return torch_memory_saver.region(tag=tag, enable_cpu_backup=enable_cpu_backup)


def pause(tag=None):
    """torch_memory_saver.pause (module-level form)."""
    torch_memory_saver.pause(tag)


def resume(tag=None):
    """torch_memory_saver.resume (module-level form)."""
    torch_memory_saver.resume(tag)


__all__ = [
    "TorchMemorySaver",
    "configure_subprocess",
    "install",
    "pause",
    "region",
    "resume",
    "torch_memory_saver",
    "uninstall",
]
