"""torch_memory_saver's API over tagmem: switch by changing the import.

    from tagmem.compat.torch_memory_saver import torch_memory_saver
    with torch_memory_saver.region(tag="kv_cache"):                          # dropped on pause
        kv = torch.empty(...)
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):   # kept on pause
        model = build().cuda()
    torch_memory_saver.pause("kv_cache"); torch_memory_saver.resume("kv_cache")

Semantics: tensors created in ``region(tag)`` live in tagmem tag `tag` (MemPool mode). ``pause``
releases their device memory keeping every address; with ``enable_cpu_backup=True`` the bytes are
copied to pinned host memory first and ``resume`` restores them, otherwise the contents after
``resume`` are undefined. ``pause()`` / ``resume()`` without a tag act on every tag a region
created. If regions of one tag disagree on enable_cpu_backup, the tag is backed up (the safe
choice). Pausing a paused tag or resuming a resident one raises, as tagmem does.
"""

import contextlib
import threading

import torch

from .. import _api
from .. import torch as _tt
from .._errors import error_for

_TAG_DEFAULT = "default"


class TorchMemorySaver:
    """The object behind the module-level ``torch_memory_saver`` (one per process is enough)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._backup = {}  # tag -> whether pause keeps its bytes

    @property
    def enabled(self):
        """Always True: tagmem is available whenever this module imports."""
        return True

    @contextlib.contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False):
        """Context manager: CUDA tensors created inside belong to `tag` (see the module doc)."""
        with self._lock:
            self._backup[tag] = self._backup.get(tag, False) or bool(enable_cpu_backup)
        with _tt.tag(tag):
            yield

    def pause(self, tag=None):
        """Releases the device memory of `tag` (None: of every region tag still resident). As in
        torch_memory_saver, the memory is back with the driver when this returns (another
        process may take it at once), so it waits for tagmem's background release."""
        device = _tt.device_index()
        for name in self._select(tag, "resident", device):
            _tt.offload(name, _tt.BACKUP if self._backup[name] else _tt.DISCARD, device)
        _api.wait_released(device)

    def resume(self, tag=None):
        """Maps `tag` again at its old addresses (None: every paused region tag)."""
        device = _tt.device_index()
        names = [n for n in self._select(tag, "offloaded", device)]
        if names:
            _tt.reload(names, device)

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, tag="cuda_graph", enable_cpu_backup=False, **kwargs):
        """``torch.cuda.graph(cuda_graph, **kwargs)`` with the graph's private memory in `tag`,
        so ``pause(tag)`` releases it too (replay needs ``resume(tag)`` first)."""
        with self._lock:
            self._backup[tag] = self._backup.get(tag, False) or bool(enable_cpu_backup)
        kwargs.setdefault("pool", _tt.pool(tag).id)
        with torch.cuda.graph(cuda_graph, **kwargs):
            yield

    def _select(self, tag, wanted, device):
        with self._lock:
            known = dict(self._backup)
        if tag is not None:
            if tag not in known:
                raise error_for(2, f"torch_memory_saver: no region was created with tag '{tag}'")
            return [tag] if tag in _api.tags(device) else []
        present = set(_api.tags(device))
        out = []
        for name in known:
            if name in present and _tt.state(name, device).startswith(wanted):
                out.append(name)
        return out


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
