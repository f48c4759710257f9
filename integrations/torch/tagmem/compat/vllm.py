"""vLLM's sleep mode over tagmem: the allocator module vLLM's workers import, replaced.

One line, before the engine builds its workers (in every worker process: vLLM's
``vllm.general_plugins`` entry point ``tagmem`` does it when TAGMEM_AS_VLLM_CUMEM=1)::

    import tagmem.compat.vllm; tagmem.compat.vllm.install()

install() puts this module in ``sys.modules`` as ``vllm.device_allocator.cumem`` and, where vLLM
has it, points ``vllm.device_allocator.get_mem_allocator_instance`` at it, so
``from vllm.device_allocator.cumem import CuMemAllocator`` in vLLM's code gets tagmem's. It needs
no vLLM to run and is idempotent.

CuMemAllocator keeps vLLM's names and defaults: ``default_tag = "default"``,
``use_memory_pool(tag=None)``, ``sleep(offload_tags=None)`` (None: the default tag is backed up),
``wake_up(tags=None)``, ``discard(tags)``, ``get_current_usage()``. vLLM's level 1 is
``sleep(offload_tags=("weights",))`` (weights backed up to pinned host memory, the KV cache
discarded), level 2 ``sleep(offload_tags=())`` (everything discarded). Tensors created inside
``use_memory_pool(tag)`` live in tagmem tag `tag` (tagmem.torch.tag) and keep their addresses
across sleep and wake_up, so CUDA graphs and views stay valid.

vLLM versions that select a sleep-mode backend by name find this one as "tagmem"
(``sleep_mode_backend="tagmem"``): the entry point registers SleepBackend in vLLM's
SleepModeBackendFactory in every process, and the backend reports itself supported once
install() has run there.

Importing this module does not import PyTorch; the allocator's methods do.
"""

import abc
import contextlib
import importlib
import os
import sys
import threading

from .. import _api, _errors

WEIGHTS = "weights"
KV_CACHE = "kv_cache"
ENABLE_VARIABLE = "TAGMEM_AS_VLLM_CUMEM"
MODULE = "vllm.device_allocator.cumem"

cumem_available = True  # vLLM checks this before using sleep mode
_install_lock = threading.Lock()


def _tt():
    from .. import torch as tt  # PyTorch only when an allocator method runs

    return tt


def _names(tags):
    if tags is None:
        return None
    return (tags,) if isinstance(tags, str) else tuple(tags)


def _in_state(names, d, wanted):
    present = set(_api.tags(d))
    return [n for n in names if n in present and (_api.state(n, d) == "resident") == wanted]


def _offload_split(keep, drop, d):
    tt = _tt()
    if drop:  # first (Note [drop before copying]): its memory is free at once
        tt.offload(drop, tt.DISCARD, d)
    if keep:
        tt.offload(keep, tt.BACKUP, d)
    if not _api.offload_returns_early():  # TAGMEM_OFFLOAD_RETURN=queued: the copies run on
        _api.wait_released(d)  # as in vLLM, the memory is free for others once this returns


_EXPANDABLE_ON = "expandable_segments:True"


@contextlib.contextmanager
def _expandable_segments_off():
    """With expandable segments on (PYTORCH_CUDA_ALLOC_CONF), PyTorch's allocator would map the
    pool's memory itself instead of asking tagmem; vLLM's use_memory_pool switches them off
    around its pool and back on after, and so does this."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get(
        "PYTORCH_ALLOC_CONF", ""
    )
    if _EXPANDABLE_ON not in conf.replace(" ", ""):
        yield
        return
    import torch

    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    try:
        yield
    finally:
        torch.cuda.memory._set_allocator_settings(_EXPANDABLE_ON)


class CuMemAllocator:
    """vLLM's CuMemAllocator over tagmem.torch (a process-wide singleton: get_instance())."""

    instance = None
    default_tag = "default"
    _instance_lock = threading.Lock()

    @staticmethod
    def get_instance():
        """The process-wide allocator object."""
        with CuMemAllocator._instance_lock:
            if CuMemAllocator.instance is None:
                CuMemAllocator.instance = CuMemAllocator()
            return CuMemAllocator.instance

    def __init__(self):
        self.current_tag = CuMemAllocator.default_tag
        self._tags = []  # every tag a pool was used for, in first-use order

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        """Context manager: CUDA tensors created inside live in tag `tag` (None: default_tag)."""
        tag = CuMemAllocator.default_tag if tag is None else tag
        if not isinstance(tag, str):
            raise _errors.error_for(1, f"use_memory_pool: tag must be a str, not {tag!r}")
        if tag not in self._tags:
            self._tags.append(tag)
        previous, self.current_tag = self.current_tag, tag
        try:
            with _expandable_segments_off(), _tt().tag(tag):
                yield
        finally:
            self.current_tag = previous

    def sleep(self, offload_tags=None):
        """Backs up the resident tags in `offload_tags` (None: default_tag) and discards this
        allocator's other resident tags; the memory is back with the driver on return."""
        keep_names = _names(offload_tags) or ()
        if offload_tags is None:
            keep_names = (CuMemAllocator.default_tag,)
        d = _tt().device_index()
        resident = _in_state(self._tags, d, True)
        _offload_split([t for t in resident if t in keep_names],
                       [t for t in resident if t not in keep_names], d)

    def discard(self, tags):
        """Drops the bytes of the resident tags among `tags` (offloaded with DISCARD; asleep
        afterwards). Tags already asleep are left as they are, backup included, as vLLM skips
        allocations that are asleep: reloading one to discard it would need its full size free
        and would destroy a backup a later wake_up() restores."""
        names = [t for t in _names(tags) if t in self._tags]
        d = _tt().device_index()
        _offload_split([], _in_state(names, d, True), d)

    def wake_up(self, tags=None):
        """Maps `tags` (None: every asleep tag of this allocator) back at their old addresses,
        restoring backed-up bytes. A wake-up that does not fit raises OutOfMemoryError with the
        tag still asleep and its backup intact."""
        names = self._tags if tags is None else [t for t in _names(tags) if t in self._tags]
        d = _tt().device_index()
        waiting = _in_state(names, d, False)
        if waiting:
            _tt().reload(waiting, d)

    def get_current_usage(self):
        """Device bytes mapped for this allocator's tags now."""
        d = _tt().device_index()
        present = set(_api.tags(d))
        return sum(_api.stats(t, d)["mapped_bytes"] for t in self._tags if t in present)


def get_mem_allocator_instance():
    """vllm.device_allocator.get_mem_allocator_instance, answered by tagmem."""
    return CuMemAllocator.get_instance()


def find_loaded_library(lib_name):
    """The path of a loaded shared library whose file name starts with `lib_name` (vLLM's helper
    of the same name), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if "/" in line else ""
            if os.path.basename(path).startswith(lib_name):
                return path
    return None


def install():
    """Makes vLLM's ``vllm.device_allocator.cumem`` this module (see the module doc).
    Idempotent; works whether vLLM is imported before or after, or not at all: vLLM modules
    that bound ``CuMemAllocator`` by name already are rebound to tagmem's (once vLLM's has
    allocated, RuntimeError)."""
    me = sys.modules[__name__]
    with _install_lock:
        replaced = sys.modules.get(MODULE)
        if replaced is not None and replaced is not me:  # refuses before changing anything
            _rebind(replaced)
        sys.modules[MODULE] = me
        parent = sys.modules.get("vllm.device_allocator")
        if parent is None:
            try:
                import vllm.device_allocator as parent  # noqa: F811
            except ImportError:
                parent = None
        if parent is not None:
            parent.cumem = me
            if hasattr(parent, "get_mem_allocator_instance"):
                parent.get_mem_allocator_instance = get_mem_allocator_instance


def _rebind(replaced):
    """vLLM's modules that imported CuMemAllocator by name from module `replaced` before
    install() (gpu_worker.py does at import) hold vLLM's class: they get tagmem's (`replaced`
    itself, vLLM's definition, stays as it is). Memory vLLM's allocator has handed out already
    cannot move into tagmem's tags, so that is refused, saying what to do."""
    original = getattr(replaced, "CuMemAllocator", None)
    if original is None or original is CuMemAllocator:
        return
    if getattr(original, "instance", None) is not None:
        raise RuntimeError(
            "tagmem.compat.vllm.install(): vLLM's CuMemAllocator has allocated memory already; "
            "install tagmem's before vLLM builds its workers (the vllm.general_plugins entry "
            "point does, with TAGMEM_AS_VLLM_CUMEM=1)"
        )
    for name, module in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and module not in (None, replaced):
            if getattr(module, "CuMemAllocator", None) is original:
                module.CuMemAllocator = CuMemAllocator


def installed():
    """Whether install() has put this module in place of vLLM's."""
    return sys.modules.get(MODULE) is sys.modules[__name__]


BACKEND_NAME = "tagmem"
RELEASE_HOST_VARIABLE = "VLLM_SLEEP_MODE_RELEASE_HOST_MEMORY"
BACKEND_MODULE = "vllm.device_allocator.sleep_mode_backend"


class SleepBackend:
    """vLLM's sleep-mode backend interface over CuMemAllocator.get_instance(), registered under
    the name "tagmem" (``sleep_mode_backend="tagmem"``): ``suspend(level)``, ``resume(tags)``,
    ``discard(tags)``, ``state()`` and the capability class methods vLLM asks before use."""

    name = BACKEND_NAME

    def __init__(self):
        self._state = "RUNNING"

    def suspend(self, level=1):
        """Level 1: weights backed up, the rest discarded. Level 2: everything discarded.
        Level 0: nothing released (vLLM's level 0 only pauses scheduling)."""
        if level not in (0, 1, 2):
            raise _errors.error_for(1, f"sleep level {level!r}: expected 0, 1 or 2")
        if level:
            CuMemAllocator.get_instance().sleep(offload_tags=(WEIGHTS,) if level == 1 else ())
        self._state = "SUSPENDED"

    def resume(self, tags=None):
        """Wakes `tags` (None: all). With VLLM_SLEEP_MODE_RELEASE_HOST_MEMORY=1, as vLLM's own
        backend does, the pinned host memory the backups no longer use goes back to the OS
        (tagmem.host_trim) instead of staying cached for the next sleep."""
        self._state = "RESUMING"
        CuMemAllocator.get_instance().wake_up(tags)
        if os.environ.get(RELEASE_HOST_VARIABLE, "0").strip().lower() in ("1", "true"):
            _api.host_trim(0)
        self._state = "RUNNING"

    def discard(self, tags):
        CuMemAllocator.get_instance().discard(tags)
        self._state = "SUSPENDED"

    def state(self):
        """"RUNNING", "SUSPENDED" or "RESUMING", as vLLM's backends report it."""
        return self._state

    @classmethod
    def is_supported(cls):
        """Only once install() has run: otherwise vLLM's workers allocated their weights through
        vLLM's own allocator, which this backend cannot put to sleep."""
        return installed()

    @classmethod
    def preserves_communicators(cls):
        return True  # NCCL's buffers are not in tagmem's tags and stay where they are

    @classmethod
    def preserves_compiled_artifacts(cls):
        return True  # the process and its kernels stay

    @classmethod
    def preserves_graphs_with_communicators(cls):
        return True  # addresses are unchanged and communicators are kept

    @classmethod
    def supports_durable_storage(cls):
        return False


def _register_backend():
    # vLLM versions without a backend registry select sleep mode through the allocator module
    # alone, which install() replaces.
    try:
        registry = importlib.import_module(BACKEND_MODULE)
    except ImportError:
        return False
    factory = getattr(registry, "SleepModeBackendFactory", None)
    if factory is None:
        return False
    base = getattr(registry, "SleepModeBackend", None)
    if isinstance(base, abc.ABCMeta) and not issubclass(SleepBackend, base):
        base.register(SleepBackend)  # isinstance checks against vLLM's interface hold
    # Plugins load once per process, possibly more than once: a name already there is ours.
    if BACKEND_NAME not in getattr(factory, "_registry", {}):
        try:
            factory.register_backend(BACKEND_NAME, __name__, "SleepBackend")
        except ValueError:
            pass
    return True


def register():
    """The ``vllm.general_plugins`` entry point (vLLM calls it in every process it starts):
    registers SleepBackend as sleep-mode backend "tagmem" where vLLM has the backend registry,
    and installs the allocator module only when TAGMEM_AS_VLLM_CUMEM=1, so having tagmem
    installed never changes vLLM by itself. Idempotent. Returns whether the backend was
    registered."""
    if os.environ.get(ENABLE_VARIABLE) == "1":
        install()
    return _register_backend()


def sleep(level=1, weights_tags=(WEIGHTS,), discard_tags=(KV_CACHE,), device=None):
    """Releases the device memory of the weight and KV-cache tags that exist and are resident
    (level 1: `weights_tags` backed up; level 2: discarded too). Raises InvalidArgumentError for
    another level."""
    if level not in (1, 2):
        raise _errors.error_for(1, f"sleep level {level!r}: expected 1 or 2")
    d = _tt().device_index(device)
    keep = _in_state(weights_tags, d, True)
    drop = _in_state(discard_tags, d, True)
    _offload_split(keep if level == 1 else [], drop + ([] if level == 1 else keep), d)


def wake_up(tags=None, device=None):
    """Reloads `tags` (default: every offloaded tag on the device) at their old addresses."""
    d = _tt().device_index(device)
    names = _api.tags(d) if tags is None else _names(tags)
    waiting = _in_state(names, d, False)
    if waiting:
        _tt().reload(waiting, d)
