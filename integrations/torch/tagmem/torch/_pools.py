"""MemPool mode: tensors created inside ``tagmem.torch.tag(name)`` live in tag `name`.

Each (tag, device) gets a ``torch.cuda.MemPool`` whose allocator is the tag's slot of
libtagmem_torch_alloc.so (Note [torch allocator slots]). PyTorch's caching allocator routes the
block's allocations to that pool and sub-allocates inside its segments; every segment is one
tagmem allocation in the tag, so offloading the tag unmaps everything PyTorch put there while the
segments, blocks and tensors keep their addresses.

Note [pools live for the process]: PyTorch keeps a segment's allocator to free it later, possibly
after the MemPool object is gone, so the CUDAPluggableAllocator objects are never dropped. MemPool
objects are dropped only by empty_cache(), which is how a live pool's cached free segments are
given back (PyTorch's torch.cuda.empty_cache() leaves pools that are still referenced alone).
"""

import contextlib
import threading

import torch

from .. import _api, _entry_points, _errors
from . import _global

_lock = threading.RLock()
_allocators = {}  # tag -> CUDAPluggableAllocator, never dropped (Note [pools live for the process])
_pools = {}  # (tag, device index) -> torch.cuda.MemPool
_verified = set()  # (tag, device index) whose routing into tagmem was checked


def device_index(device=None):
    """The CUDA device index for `device` (None: torch.cuda.current_device())."""
    if device is None:
        return torch.cuda.current_device()
    return torch.cuda._get_device_index(device, optional=True)


def _allocator(name):
    allocator = _allocators.get(name)
    if allocator is None:
        slot = _entry_points.slot_for(name)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            _entry_points.path(), _entry_points.slot_function(slot), _entry_points.FREE
        )
        _allocators[name] = allocator
    return allocator


def pool(name, device=None):
    """The ``torch.cuda.MemPool`` holding tag `name` on `device`, created on first use.

    Use it where PyTorch asks for a pool, e.g. to put a CUDA graph's private memory in a tag:
    ``torch.cuda.graph(g, pool=tagmem.torch.pool("graph").id)``. Unavailable in global mode.
    """
    if _global.installed():
        raise _errors.error_for(
            1, "tagmem.torch.pool(): MemPool mode is unavailable after tagmem.torch.install()"
        )
    d = device_index(device)
    with _lock:
        p = _pools.get((name, d))
        if p is None:
            with torch.cuda.device(d):
                p = torch.cuda.MemPool(_allocator(name).allocator())
            _pools[(name, d)] = p
        return p


_tag_pool = pool  # tag() below takes a `pool` argument


def new_pool(name, device=None):
    """A fresh ``torch.cuda.MemPool`` over tag `name`'s allocator on `device`, held only by the
    caller: once the caller drops it and PyTorch empties its cache (``torch.cuda.empty_cache()``),
    its segments are freed in tagmem, as with a pool of PyTorch's own allocator. Pass it to
    ``tag(name, pool=...)``."""
    if _global.installed():
        raise _errors.error_for(
            1, "tagmem.torch.new_pool(): MemPool mode is unavailable after tagmem.torch.install()"
        )
    d = device_index(device)
    with torch.cuda.device(d):
        return torch.cuda.MemPool(_allocator(name).allocator())


def _require_resident(name, d):
    if name in _api.tags(d) and _api.state(name, d) != "resident":
        raise _errors.error_for(
            3,
            f"tag '{name}' is offloaded on device {d}: reload it before allocating in it "
            "(PyTorch would hand out cached blocks of its unmapped segments)",
        )


def _verify(name, d):
    # PyTorch bypasses a pool's allocator in some configurations (expandable segments in some
    # versions). One tiny tensor proves that allocations really reach tagmem, instead of
    # offloading memory that was never in the tag.
    if (name, d) in _verified:
        return
    probe = torch.empty(1, dtype=torch.uint8, device=torch.device("cuda", d))
    try:
        owner = _api.pointer_info(probe.data_ptr())["tag"]
    except _errors.UnknownPointerError:
        owner = None
    del probe
    if owner != name:
        raise _errors.error_for(
            13,
            f"allocations inside tagmem.torch.tag('{name}') went to "
            f"{'tag ' + repr(owner) if owner else 'memory tagmem does not own'}: PyTorch bypassed "
            "the pool's allocator (is PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set?)",
        )
    _verified.add((name, d))


@contextlib.contextmanager
def tag(name, device=None, all_threads=False, pool=None):
    """Context manager: CUDA tensors created inside the block live in tag `name`.

    MemPool mode (the default): allocations of this thread on `device` (default: the current
    device) go to the tag's MemPool; with ``all_threads=True`` allocations of *every* thread on
    that device do, which is how autograd's backward threads (gradients) reach a tag. Raises
    TagOffloadedError if the tag is offloaded. Yields the MemPool: the tag's own (``pool(name)``),
    or `pool` when given (one from ``new_pool(name)``).

    Global mode (after install()): the block is a tagmem thread scope (tagmem.tag); all_threads is
    not available there. Yields None.

    When PyTorch raises torch.OutOfMemoryError inside the block because tagmem refused memory,
    tagmem's reason is added to the exception as a note.
    """
    if _global.installed():
        if all_threads:
            raise _errors.error_for(
                1, "tagmem.torch.tag(all_threads=True) needs MemPool mode, not install()"
            )
        with _api.tag(name):
            yield None
        return
    d = device_index(device)
    _require_resident(name, d)
    p = pool if pool is not None else _tag_pool(name, d)
    failures = _entry_points.failures()
    routing = _all_threads(p, d) if all_threads else torch.cuda.use_mem_pool(p, d)
    with routing:
        try:
            _verify(name, d)
            yield p
        except torch.OutOfMemoryError as e:
            if _entry_points.failures() != failures and hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(_entry_points.last_failure())
            raise


@contextlib.contextmanager
def _all_threads(p, d):
    # torch.cuda.use_mem_pool routes only the calling thread; the binding under it also has a
    # form whose stream filter accepts every stream, hence every thread.
    begin = getattr(torch._C, "_cuda_beginAllocateToPool", None)
    if begin is None:
        raise _errors.error_for(1, "this PyTorch has no _cuda_beginAllocateToPool: all_threads=True is unavailable")
    begin(d, p.id)
    try:
        yield
    finally:
        torch._C._cuda_endAllocateToPool(d, p.id)
        torch._C._cuda_releasePool(d, p.id)


def empty_cache(tags=None, device=None):
    """Gives back device memory cached for tags: PyTorch's free segments in the tags' pools, then
    tagmem's segments that hold no live allocation (tagmem.empty_cache).

    `tags`: a name or list of names (default: every tag with a pool on the device). A pool in use
    (an open tag() block, a CUDA graph) keeps its memory until released.
    """
    d = device_index(device)
    if isinstance(tags, str):
        tags = [tags]
    with _lock:
        keys = [k for k in _pools if k[1] == d and (tags is None or k[0] in tags)]
        dropped = [_pools.pop(k) for k in keys]
    # Dropping the last reference runs ~MemPool: release the pool and empty its cache.
    del dropped
    torch.cuda.synchronize(d)
    _api.empty_cache(d)
