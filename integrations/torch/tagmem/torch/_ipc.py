"""Tagged CUDA tensors sent to other processes: the ForkingPickler reductions tagmem registers.

PyTorch shares a CUDA tensor (torch.multiprocessing queues, ``reduce_tensor``, SGLang's
MultiprocessingSerializer) through ``storage._share_cuda_()``, which asks the allocator that owns
the memory for a legacy ``cudaIpcGetMemHandle`` handle (or, for its own expandable segments, for
the segment's cuMem handles). Neither reaches tagmem's memory: virtual-memory allocations have no
legacy handle, and a ``CUDAPluggableAllocator`` (global mode) has no ``shareIpcHandle``. So
``import tagmem.torch`` registers reductions for ``torch.Tensor``, ``torch.nn.Parameter`` and
``torch.UntypedStorage`` in ``multiprocessing.reduction.ForkingPickler`` (replacing PyTorch's, which
every tensor that is not tagmem's still goes to): a CUDA tensor whose storage lies in a tagmem
allocation is sent as a tagmem IPC handle (``tagmem.ipc_export`` of the storage's range) with its
dtype, size, stride and offset; the receiving process, which needs ``tagmem`` importable and
nothing of its own in tagmem, maps the same device memory (``tagmem.ipc_open``) and builds a
tensor over it. Several tensors of one storage in one process share one mapping, closed when the
last of them is freed.

As with PyTorch's own CUDA sharing, the sender keeps the tensor alive while receivers use it.
The sender waits for the work queued on its current stream before the handle leaves (PyTorch
records an event for the receiver instead), so the receiver reads what was written. While a
receiver maps a tag's memory, that tag cannot be offloaded (PeerError naming the process): the
receiver drops its tensors first (docs/ipc.md).
"""

import threading
import weakref
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (PyTorch registers its reductions on import)

from .. import _api, _errors, _ipc

_lock = threading.Lock()
_original = {}  # class -> the reducer registered before tagmem's
# PyTorch's own reducers as torch.multiprocessing.reductions defines them, before register()
# puts tagmem's in their place there too (callers that call reduce_tensor themselves).
_reductions = torch.multiprocessing.reductions
_torch_reduce_tensor = getattr(
    _reductions.reduce_tensor, "_tagmem_wraps", _reductions.reduce_tensor
)
_torch_reduce_storage = getattr(
    _reductions.reduce_storage, "_tagmem_wraps", _reductions.reduce_storage
)
_mappings = weakref.WeakValueDictionary()  # IpcHandle -> IpcMapping open in this process


def _tagged_range(storage):
    """(ptr, nbytes) of a CUDA storage inside a tagmem allocation, else None."""
    if storage.device.type != "cuda":
        return None
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    if ptr == 0 or nbytes == 0:
        return None
    try:
        _api.pointer_info(ptr)
    except _errors.UnknownPointerError:
        return None
    return ptr, nbytes


def _export(storage, span):
    torch.cuda.current_stream(storage.device).synchronize()
    return _ipc.ipc_export(*span)


class _ArrayInterface:
    """The mapping's bytes as __cuda_array_interface__; PyTorch keeps this object (and so the
    mapping) alive for as long as the storage built over it lives."""

    def __init__(self, mapping):
        self.mapping = mapping
        self.__cuda_array_interface__ = {
            "shape": (mapping.nbytes,),
            "typestr": "|u1",
            "data": (mapping.ptr, False),
            "version": 2,
            "strides": None,
        }


def _storage_for(handle):
    torch.cuda._lazy_init()
    with _lock:
        mapping = _mappings.get(handle)
        if mapping is None:
            mapping = _ipc.ipc_open(handle)
            _mappings[handle] = mapping
    device = torch.device("cuda", mapping.device)
    return torch.as_tensor(_ArrayInterface(mapping), device=device).untyped_storage()


def _rebuild_tensor(cls, handle, dtype, size, stride, offset, requires_grad):
    storage = _storage_for(handle)
    t = torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _rebuild_storage(handle):
    return _storage_for(handle)


def _reduce_tensor(tensor):
    if tensor.is_cuda and tensor.layout == torch.strided and not tensor.is_nested:
        storage = tensor.untyped_storage()
        span = _tagged_range(storage)
        if span is not None:
            if tensor.requires_grad and not tensor.is_leaf:
                raise RuntimeError(
                    "Cowardly refusing to serialize non-leaf tensor which requires_grad, since "
                    "autograd does not support crossing process boundaries.  If you just want to "
                    "transfer the data, call detach() on the tensor before serializing"
                )
            return (
                _rebuild_tensor,
                (
                    type(tensor),
                    _export(storage, span),
                    tensor.dtype,
                    tuple(tensor.size()),
                    tuple(tensor.stride()),
                    tensor.storage_offset(),
                    tensor.requires_grad,
                ),
            )
    return _original.get(type(tensor), _original[torch.Tensor])(tensor)


def _reduce_storage(storage):
    span = _tagged_range(storage)
    if span is not None:
        return (_rebuild_storage, (_export(storage, span),))
    return _original[torch.UntypedStorage](storage)


def reduce_tensor(tensor):
    """``torch.multiprocessing.reductions.reduce_tensor`` once tagmem.torch is imported, for
    callers that call it themselves and send its ``(rebuild, args)`` (verl, OpenRLHF): tagmem's
    reduction for a tensor in a tag, PyTorch's for any other."""
    return _reduce_tensor(tensor)


def reduce_storage(storage):
    """``torch.multiprocessing.reductions.reduce_storage`` once tagmem.torch is imported."""
    return _reduce_storage(storage)


reduce_tensor._tagmem_wraps = _torch_reduce_tensor
reduce_storage._tagmem_wraps = _torch_reduce_storage


def register():
    """Puts tagmem's reductions in front of PyTorch's (idempotent): in ForkingPickler, and as
    torch.multiprocessing.reductions' reduce_tensor and reduce_storage (a caller that imported
    those names before tagmem.torch keeps PyTorch's)."""
    reducers = ForkingPickler._extra_reducers
    with _lock:
        tensor_classes = {torch.Tensor, torch.nn.parameter.Parameter}
        tensor_classes.update(c for c, r in reducers.items() if r is _torch_reduce_tensor)
        for cls in tensor_classes:
            current = reducers.get(cls)
            if current is not _reduce_tensor:
                # reduce_tensor (registered by someone since) leads back here: PyTorch's instead.
                _original[cls] = (
                    _torch_reduce_tensor if current in (None, reduce_tensor) else current
                )
                ForkingPickler.register(cls, _reduce_tensor)
        current = reducers.get(torch.UntypedStorage)
        if current is not _reduce_storage:
            _original[torch.UntypedStorage] = (
                _torch_reduce_storage if current in (None, reduce_storage) else current
            )
            ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
        _reductions.reduce_tensor = reduce_tensor
        _reductions.reduce_storage = reduce_storage
