"""tagmem.torch: PyTorch tensors in tags that survive offload at unchanged addresses.

MemPool mode (default)::

    import tagmem.torch as tt
    with tt.tag("weights"):
        model = build_model().cuda()       # parameters live in tag "weights"
    tt.offload("weights")                  # device memory released, bytes in pinned host memory
    tt.reload("weights")                   # same data_ptr()s, same values

Global mode: call ``tt.install()`` before CUDA initialises; then every CUDA allocation goes
through tagmem and ``tt.tag`` is a per-thread tag scope. Functions taking `device` default to
``torch.cuda.current_device()``. See docs/torch.md.
"""

import ctypes

import torch

from .. import _api, _entry_points, _errors
from ._global import full_support, install, installed, joined_frees
from ._pools import device_index, empty_cache, new_pool, pool, tag
from ._summary import memory_stats, memory_summary
from . import _ipc

_ipc.register()  # tagged CUDA tensors cross processes as tagmem IPC handles (docs/ipc.md)

BACKUP = _api.BACKUP
DISCARD = _api.DISCARD


def offload(tags, mode=BACKUP, device=None):
    """tagmem.offload on `device` (default: the current CUDA device). Waits for the device's
    queued work first, so no kernel still touches the memory."""
    _api.offload(tags, mode, device_index(device))


def reload(tags, device=None):
    """tagmem.reload on `device` (default: the current CUDA device)."""
    _api.reload(tags, device_index(device))


def swap(out_tags, in_tags, mode=BACKUP, device=None):
    """tagmem.swap on `device` (default: the current CUDA device)."""
    _api.swap(out_tags, in_tags, mode, device_index(device))


def set_replicated(name, group, rank=None, size=None, device=None):
    """tagmem.set_replicated on `device` (default: the current CUDA device): the tag's BACKUP
    offloads keep one host copy shared by its replicas, `rank` of `size` in `group` within the
    job, each copying its share (docs/replicated.md). `group=None` makes it plain again."""
    _api.set_replicated(name, group, rank, size, device_index(device))


def resident(*names, mode=None, device=None):
    """tagmem.resident on `device` (default: the current CUDA device): reload on entry, offload
    on exit (each tag in `mode`, one for all or a dict per tag, else in the mode it was offloaded
    in when the block began, else BACKUP)."""
    return _api.resident(*names, mode=mode, device=device_index(device))


def wait_released(device=None):
    """tagmem.wait_released on `device` (default: the current CUDA device): returns once the
    memory that DISCARD offloads and swaps gave up is back with the driver (for other processes,
    or for PyTorch's own allocator)."""
    _api.wait_released(device_index(device))


def state(name, device=None):
    """tagmem.state on `device` (default: the current CUDA device)."""
    return _api.state(name, device_index(device))


def stats(name=None, device=None):
    """tagmem.stats on `device` (default: the current CUDA device): dicts keyed like the C
    structs. With no `name`, also ``torch_reserved_bytes`` / ``torch_allocated_bytes`` from
    PyTorch's allocator in MemPool mode (see docs/torch.md: PyTorch keeps counting an offloaded
    tag's segments as reserved)."""
    d = device_index(device)
    out = _api.stats(name, d)
    if name is None and not installed():
        out["torch_reserved_bytes"] = torch.cuda.memory_reserved(d)
        out["torch_allocated_bytes"] = torch.cuda.memory_allocated(d)
    return out


def host_tensor(x, copy=True):
    """A CPU tensor of `x`'s bytes while its tag is offloaded with BACKUP (same dtype and shape).

    ``copy=True``: a new tensor (the backup may lie in several host pieces). ``copy=False``: a
    view of the pinned backup itself (writes through it are what the reload restores); valid
    until the tag is reloaded, and only when the bytes are one host piece (else
    InvalidArgumentError). `x` must be contiguous. Raises TagResidentError while the tag is
    resident, TagOffloadedError when it was offloaded with DISCARD.
    """
    if not x.is_contiguous():
        raise _errors.error_for(1, "host_tensor needs a contiguous tensor")
    nbytes = x.numel() * x.element_size()
    if nbytes == 0:
        return torch.empty(x.shape, dtype=x.dtype)
    pieces = _api.host_pieces(x.data_ptr(), nbytes, writable=not copy)
    if not copy and len(pieces) != 1:
        raise _errors.error_for(
            1,
            f"the tensor's {nbytes} bytes lie in {len(pieces)} host pieces: a view needs one "
            "(use copy=True)",
        )
    return tensor_over_pieces(pieces, x, copy)


def tensor_over_pieces(pieces, x, copy):
    """A CPU tensor with `x`'s dtype and shape over host `pieces` ((address, length), in order,
    as tagmem.host_pieces gives them): a new tensor holding their bytes, or with ``copy=False`` a
    view of the single piece."""
    if copy:
        out = torch.empty(sum(n for _, n in pieces), dtype=torch.uint8)
        at = out.data_ptr()
        for address, n in pieces:
            ctypes.memmove(at, address, n)
            at += n
    else:
        (address, n), = pieces
        out = torch.frombuffer((ctypes.c_uint8 * n).from_address(address), dtype=torch.uint8)
    return out.view(x.dtype).view(x.shape)


def last_allocation_failure():
    """tagmem's message for the most recent allocation it refused through PyTorch ("" if none)."""
    return _entry_points.last_failure()


__all__ = [
    "BACKUP",
    "DISCARD",
    "device_index",
    "empty_cache",
    "full_support",
    "host_tensor",
    "install",
    "installed",
    "joined_frees",
    "last_allocation_failure",
    "new_pool",
    "offload",
    "pool",
    "reload",
    "resident",
    "set_replicated",
    "state",
    "stats",
    "swap",
    "tag",
    "tensor_over_pieces",
    "wait_released",
]
