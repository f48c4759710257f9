"""vLLM-style sleep mode over tagmem: switch by changing the import.

Level semantics follow vLLM's ``LLM.sleep(level)``: level 1 backs the weights up to pinned host
memory and discards the KV cache; level 2 discards both (the caller reloads weights itself, e.g.
from the trainer). ``wake_up(tags)`` maps tags back at their old addresses, optionally one group at
a time (``wake_up(["weights"])`` before a weight update, ``wake_up(["kv_cache"])`` after it).

    from tagmem.compat.vllm import CuMemAllocator        # instead of vllm.device_allocator.cumem
    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        model = load_model()
    allocator.sleep(offload_tags=("weights",))          # weights backed up, other tags discarded
    allocator.wake_up()

Tensors must be created inside ``use_memory_pool(tag)`` (tagmem.torch.tag) to belong to a tag.
"""

import threading

from .. import _api, _errors
from .. import torch as _tt

WEIGHTS = "weights"
KV_CACHE = "kv_cache"


def sleep(level=1, weights_tags=(WEIGHTS,), discard_tags=(KV_CACHE,), device=None):
    """Releases the device memory of the weight and KV-cache tags that exist and are resident.

    level 1: `weights_tags` are backed up, `discard_tags` discarded. level 2: both discarded.
    Raises InvalidArgumentError for another level.
    """
    if level not in (1, 2):
        raise _errors.error_for(1, f"sleep level {level!r}: expected 1 or 2")
    d = _tt.device_index(device)
    keep = _resident(weights_tags, d)
    drop = _resident(discard_tags, d)
    if keep:
        _tt.offload(keep, _tt.BACKUP if level == 1 else _tt.DISCARD, d)
    if drop:
        _tt.offload(drop, _tt.DISCARD, d)
    _api.wait_released(d)  # as in vLLM, the memory is free for others once sleep returns


def wake_up(tags=None, device=None):
    """Reloads `tags` (default: every offloaded tag on the device) at their old addresses."""
    d = _tt.device_index(device)
    if tags is None:
        tags = [n for n in _api.tags(d) if _api.state(n, d) != "resident"]
    elif isinstance(tags, str):
        tags = [tags]
    if tags:
        _tt.reload(list(tags), d)


def _resident(names, d):
    present = set(_api.tags(d))
    return [n for n in names if n in present and _api.state(n, d) == "resident"]


class CuMemAllocator:
    """The subset of vLLM's CuMemAllocator that engines call, over tagmem.torch."""

    _instance = None
    _instance_lock = threading.Lock()

    @classmethod
    def get_instance(cls):
        """The process-wide allocator object."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self):
        self._tags = []

    def use_memory_pool(self, tag=None):
        """Context manager: tensors created inside belong to `tag` (default "weights")."""
        tag = tag or WEIGHTS
        if tag not in self._tags:
            self._tags.append(tag)
        return _tt.tag(tag)

    def sleep(self, offload_tags=(WEIGHTS,)):
        """Backs up `offload_tags` to pinned host memory and discards this allocator's other
        tags (only those that exist and are resident)."""
        if isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        d = _tt.device_index()
        keep = _resident([t for t in self._tags if t in offload_tags], d)
        drop = _resident([t for t in self._tags if t not in offload_tags], d)
        if keep:
            _tt.offload(keep, _tt.BACKUP, d)
        if drop:
            _tt.offload(drop, _tt.DISCARD, d)
        _api.wait_released(d)  # as in vLLM, the memory is free for others once sleep returns

    def wake_up(self, tags=None):
        """Reloads `tags` (default: this allocator's offloaded tags)."""
        d = _tt.device_index()
        present = set(_api.tags(d))
        names = self._tags if tags is None else ([tags] if isinstance(tags, str) else list(tags))
        waiting = [t for t in names if t in present and _api.state(t, d) != "resident"]
        if waiting:
            _tt.reload(waiting, d)

    def get_current_usage(self):
        """Device bytes mapped for this allocator's tags now."""
        d = _tt.device_index()
        present = set(_api.tags(d))
        return sum(_api.stats(t, d)["mapped_bytes"] for t in self._tags if t in present)
