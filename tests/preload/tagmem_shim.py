"""tagmem_shim.py — ctypes access to libtagmem_preload.so from a process started under it.

The shim exports tagmem's C ABI (tagmem.h) and the NCCL functions (tagmem_nccl.h) into the
process's global scope, so ctypes.CDLL(None) finds them; nothing here loads a library itself.
Used by the GPU scripts of tests/preload (torch_nccl_pause.py, torch_runtime_offload.py).
"""
import ctypes

TAGMEM_SUCCESS = 0
TAGMEM_BACKUP = 0
TAGMEM_CURRENT_DEVICE = -1

_SIZE_FIELDS = [
    "held_bytes", "resident_bytes", "released_bytes", "backup_bytes", "allocations",
    "local_bytes", "exported_bytes", "imported_bytes",
    "local_allocations", "exported_allocations", "imported_allocations",
    "classic_bytes", "host_located_bytes", "passthrough_bytes",
    "last_released_bytes", "last_released_local_bytes", "last_released_exported_bytes",
    "last_released_imported_bytes", "last_released_allocations",
    "last_kept_bytes", "last_kept_allocations", "pause_count", "resume_count",
]


class NcclStats(ctypes.Structure):
    """Mirror of tagmem_nccl_stats (every field 64-bit but `paused`)."""
    _fields_ = ([(name, ctypes.c_uint64) for name in _SIZE_FIELDS] + [("paused", ctypes.c_int)]
                + [("backup_store_used_bytes", ctypes.c_uint64)])

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


class TagStats(ctypes.Structure):
    """Mirror of tagmem_tag_stats."""
    _fields_ = [("state", ctypes.c_int)] + [(n, ctypes.c_uint64) for n in (
        "allocated_bytes", "requested_bytes", "reserved_bytes", "mapped_bytes", "host_bytes",
        "virtual_bytes", "live_allocations", "mappings", "alloc_count", "free_count",
        "offload_count", "reload_count", "bytes_offloaded", "bytes_reloaded",
        "peak_allocated_bytes", "peak_mapped_bytes", "parked_bytes")]


class TagmemError(RuntimeError):
    pass


class Shim:
    def __init__(self):
        lib = ctypes.CDLL(None)
        try:
            lib.tagmem_nccl_pause
        except AttributeError as e:
            raise TagmemError("libtagmem_preload.so is not loaded (start under LD_PRELOAD)") from e
        self.lib = lib
        lib.tagmem_last_error.restype = ctypes.c_char_p
        lib.tagmem_status_string.restype = ctypes.c_char_p
        for f in ("tagmem_nccl_pause", "tagmem_nccl_resume"):
            getattr(lib, f).argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        # The _sized entry points, given the size of the structs here (docs/abi.md).
        lib.tagmem_nccl_stats_get_sized.argtypes = [ctypes.POINTER(NcclStats), ctypes.c_size_t]
        lib.tagmem_offload.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                       ctypes.c_int, ctypes.c_int]
        lib.tagmem_reload.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_int]
        lib.tagmem_pointer_info.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                            ctypes.POINTER(ctypes.c_int),
                                            ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.POINTER(ctypes.c_size_t)]
        lib.tagmem_tag_stats_get_sized.argtypes = [ctypes.c_char_p, ctypes.c_int,
                                                   ctypes.POINTER(TagStats), ctypes.c_size_t]

    def _check(self, status, what):
        if status != TAGMEM_SUCCESS:
            name = self.lib.tagmem_status_string(status).decode()
            raise TagmemError(f"{what}: {name}: {self.lib.tagmem_last_error().decode()}")

    def status_of(self, status):
        return self.lib.tagmem_status_string(status).decode()

    # group None: TAGMEM_NCCL_GROUP, else "nccl", within the job the launcher identifies
    # (docs/nccl.md).
    def nccl_pause(self, group, rank, size, timeout_ms=60000):
        name = group.encode() if group is not None else None
        self._check(self.lib.tagmem_nccl_pause(name, rank, size, timeout_ms), "pause")

    def nccl_resume(self, group, rank, size, timeout_ms=60000):
        name = group.encode() if group is not None else None
        self._check(self.lib.tagmem_nccl_resume(name, rank, size, timeout_ms), "resume")

    def nccl_stats(self):
        s = NcclStats()
        self._check(self.lib.tagmem_nccl_stats_get_sized(ctypes.byref(s), ctypes.sizeof(s)), "stats")
        return s.as_dict()

    def offload(self, tags, device):
        arr = (ctypes.c_char_p * len(tags))(*[t.encode() for t in tags])
        self._check(self.lib.tagmem_offload(arr, len(tags), device, TAGMEM_BACKUP), "offload")

    def reload(self, tags, device):
        arr = (ctypes.c_char_p * len(tags))(*[t.encode() for t in tags])
        self._check(self.lib.tagmem_reload(arr, len(tags), device), "reload")

    def tag_of(self, ptr):
        buf = ctypes.create_string_buffer(64)
        status = self.lib.tagmem_pointer_info(ctypes.c_void_p(ptr), buf, 64, None, None, None)
        return buf.value.decode() if status == TAGMEM_SUCCESS else None

    def tag_stats(self, tag, device):
        s = TagStats()
        self._check(self.lib.tagmem_tag_stats_get_sized(tag.encode(), device, ctypes.byref(s),
                                                         ctypes.sizeof(s)),
                    "tag stats")
        return {n: getattr(s, n) for n, _ in s._fields_}
