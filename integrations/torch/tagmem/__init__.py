"""tagmem: tagged CUDA memory that can be offloaded and reloaded at the same addresses.

The plain tag API below needs no PyTorch (it calls libtagmem through ctypes)::

    import tagmem
    with tagmem.tag("weights"):
        ptr = tagmem.raw_alloc(1 << 20)
    tagmem.offload("weights")            # bytes to pinned host memory, device memory released
    tagmem.reload("weights")             # same addresses, same bytes
    with tagmem.resident("kv_cache"):    # reload on entry, offload on exit
        ...

PyTorch users import ``tagmem.torch`` (tensors in tags, MemPool and global modes) and, to switch
from other libraries by changing an import, ``tagmem.compat.torch_memory_saver`` or
``tagmem.compat.vllm``. See docs/torch.md.
"""

from ._api import (
    BACKUP,
    DISCARD,
    DISK,
    current_tag,
    empty_cache,
    exists,
    host_bytes,
    host_pieces,
    host_reserve,
    host_trim,
    host_view,
    memory_margin,
    init,
    offload,
    pointer_info,
    raw_alloc,
    raw_free,
    reload,
    resident,
    set_disk_dir,
    set_disk_file_bytes,
    set_keep_backup,
    set_memory_margin,
    set_replicated,
    shutdown,
    state,
    stats,
    swap,
    tag,
    tags,
    trace_flush,
    wait_released,
    handoff_expect,
    handoff_cancel,
    handoff_stats,
    release_physical,
    plan_offload,
)
from ._errors import (
    DiskIOError,
    DriverError,
    ForkedError,
    HostOutOfMemoryError,
    InternalError,
    InvalidArgumentError,
    NoDriverError,
    OutOfMemoryError,
    PeerError,
    ScopeEmptyError,
    TagmemError,
    TagmemTimeoutError,
    TagOffloadedError,
    TagResidentError,
    UnknownPointerError,
    UnknownTagError,
)
from ._ipc import IpcHandle, IpcMapping, ipc_export, ipc_open, ipc_stats, ipc_unexport
from ._lib import LibraryNotFound, library_file, origin as library_origin

__version__ = "1.0.0"

__all__ = [
    "BACKUP",
    "DISCARD",
    "DISK",
    "DiskIOError",
    "DriverError",
    "ForkedError",
    "HostOutOfMemoryError",
    "InternalError",
    "InvalidArgumentError",
    "IpcHandle",
    "IpcMapping",
    "LibraryNotFound",
    "NoDriverError",
    "OutOfMemoryError",
    "PeerError",
    "ScopeEmptyError",
    "TagOffloadedError",
    "TagResidentError",
    "TagmemError",
    "TagmemTimeoutError",
    "UnknownPointerError",
    "UnknownTagError",
    "current_tag",
    "empty_cache",
    "exists",
    "host_bytes",
    "host_pieces",
    "host_reserve",
    "host_trim",
    "host_view",
    "memory_margin",
    "init",
    "ipc_export",
    "ipc_open",
    "ipc_stats",
    "ipc_unexport",
    "library_file",
    "library_origin",
    "offload",
    "pointer_info",
    "raw_alloc",
    "raw_free",
    "reload",
    "resident",
    "set_disk_dir",
    "set_disk_file_bytes",
    "set_keep_backup",
    "set_memory_margin",
    "set_replicated",
    "shutdown",
    "trace_flush",
    "state",
    "stats",
    "swap",
    "tag",
    "tags",
    "wait_released",
    "handoff_expect",
    "handoff_cancel",
    "handoff_stats",
    "release_physical",
    "plan_offload",
]
