"""The plain tag API over tagmem's C ABI; no PyTorch needed.

Each function is a direct call into libtagmem (see _lib) whose failure raises the exception mapped
from its status (see _errors). Arguments are checked before the call (see _args): a negative size,
a device beyond a C int or a name with a NUL raises InvalidArgumentError instead of being
converted into something else. Devices are CUDA ordinals; ``None`` means the calling thread's
current CUDA device (TAGMEM_CURRENT_DEVICE: the device of its current context, device 0 when it
has none). Modes are ``"backup"`` / ``"discard"`` / ``"disk"`` or the BACKUP / DISCARD / DISK
constants.
"""

import contextlib
import ctypes
import os

from . import _args, _errors, _lib

BACKUP = 0
DISCARD = 1
DISK = 2  # TAGMEM_BACKUP_DISK: to files in the disk directory (set_disk_dir, TAGMEM_DISK_DIR)
_MODES = {"backup": BACKUP, "discard": DISCARD, "disk": DISK, BACKUP: BACKUP, DISCARD: DISCARD, DISK: DISK}
_STATES = {0: "resident", 1: "offloaded_backup", 2: "offloaded_discard", 3: "offloaded_disk"}


_device = _args.device
_name = _args.name


def _mode(mode):
    try:
        return _MODES[mode.lower() if isinstance(mode, str) else mode]
    except (KeyError, TypeError):
        raise _errors.error_for(1, f"offload mode {mode!r}: expected 'backup', 'discard' or 'disk'") from None


def _names(tags):
    """A ctypes array of names from one name or an iterable of names (kept alive by the caller)."""
    if isinstance(tags, str):
        tags = [tags]
    encoded = [_name(t) for t in tags]
    return (ctypes.c_char_p * max(1, len(encoded)))(*encoded), len(encoded)


# ---- lifetime ---------------------------------------------------------------------------------


def init(chunk_bytes=0, arena_bytes=0, copy_piece_bytes=0, max_mapping_bytes=0, host_max_bytes=0):
    """Initialises tagmem with a configuration (0 keeps the default or TAGMEM_* variable).

    Only needed to pass a configuration: tagmem initialises itself on first use. Raises
    InvalidArgumentError when tagmem is already initialised.
    """
    lib = _lib.lib()
    config = _lib.Config()
    lib.tagmem_config_init_sized(ctypes.byref(config), ctypes.sizeof(config))
    config.chunk_bytes = _args.size(chunk_bytes, "chunk_bytes")
    config.arena_bytes = _args.size(arena_bytes, "arena_bytes")
    config.copy_piece_bytes = _args.size(copy_piece_bytes, "copy_piece_bytes")
    config.max_mapping_bytes = _args.size(max_mapping_bytes, "max_mapping_bytes")
    config.host_max_bytes = _args.size(host_max_bytes, "host_max_bytes")
    _errors.check(lib.tagmem_init(ctypes.byref(config)))


def shutdown():
    """Releases every tag on every device (their pointers become invalid) and the host store.

    tagmem may be used again afterwards (it re-initialises on first use). Must not race with other
    tagmem calls; meant for tests and process teardown.
    """
    _errors.check(_lib.lib().tagmem_shutdown())


# ---- tag scope --------------------------------------------------------------------------------


@contextlib.contextmanager
def tag(name):
    """Context manager (and decorator): makes `name` the calling thread's current tag.

    Allocations made by tagmem on this thread without an explicit tag (raw_alloc without `tag`,
    and every CUDA allocation in tagmem.torch's global mode) go to `name` inside the block. Scopes
    nest and are per thread. Entering creates the tag on the thread's current device if it does
    not exist there yet. For PyTorch's default MemPool mode use ``tagmem.torch.tag``.
    """
    lib = _lib.lib()
    _errors.check(lib.tagmem_push_tag(_name(name)))
    try:
        yield name
    finally:
        _errors.check(lib.tagmem_pop_tag())


def current_tag():
    """The calling thread's current tag ("default" when no scope is open)."""
    return _lib.lib().tagmem_current_tag().decode()


# ---- offload and reload -----------------------------------------------------------------------


def offload(tags, mode=BACKUP, device=None):
    """Offloads one tag or a list of tags: their physical device memory is released.

    BACKUP copies the bytes to pinned host memory first; DISCARD drops them. Addresses stay
    reserved, so every pointer (tensor, view, CUDA graph) stays valid for the reload; touching the
    memory before the reload faults. The list is checked first: on UnknownTagError,
    TagOffloadedError or a duplicate no tag is changed. DISCARD hands the memory back to the driver
    in the background: call wait_released() before another process or allocator needs it. With
    TAGMEM_RECYCLE_PHYSICAL=keep the process keeps it, and a DISCARD offload leaves it mapped (the
    addresses do not fault) until the reload takes it back or something else needs it. With
    TAGMEM_OFFLOAD_RETURN=queued it returns once the copies are queued and finishes on a thread of
    its own; touching these tags waits for the end (docs/handoff.md).
    """
    names, count = _names(tags)
    _errors.check(_lib.lib().tagmem_offload(names, count, _device(device), _mode(mode)))


def reload(tags, device=None):
    """Reloads offloaded tags at their old addresses, restoring the bytes of BACKUP tags.

    A tag whose reload fails (OutOfMemoryError included) stays offloaded with its backup intact:
    free device memory and call again. Tags before it in the list stay reloaded.
    """
    names, count = _names(tags)
    _errors.check(_lib.lib().tagmem_reload(names, count, _device(device)))


def swap(out_tags, in_tags, mode=BACKUP, device=None):
    """A phase switch: offloads `out_tags` (in `mode`) and reloads `in_tags`, overlapping both.

    Both lists are checked before anything moves. If the reload part fails, the offload part has
    still happened and the exception says why the reload failed. The out-tags' memory goes back
    to the driver in the background once the copies are done: call wait_released() before
    another process or allocator needs it.
    """
    out_names, out_count = _names(out_tags)
    in_names, in_count = _names(in_tags)
    _errors.check(
        _lib.lib().tagmem_swap(
            out_names, out_count, in_names, in_count, _device(device), _mode(mode)
        )
    )


def state(name, device=None):
    """A tag's state: "resident", "offloaded_backup" or "offloaded_discard"."""
    return _STATES[_tag_stats(name, device).state]


def exists(name, device=None):
    """Whether tag `name` exists on the device (it does from its first allocation or tag scope
    there on)."""
    return name in tags(device)


@contextlib.contextmanager
def resident(*names, mode=None, device=None):
    """Context manager: the listed tags are resident inside the block and offloaded after it.

    On entry, every listed tag that exists and is offloaded is reloaded (a tag that does not exist
    yet is created by allocations inside the block). On exit, also when the block raised, every
    listed tag that exists and is resident is offloaded again. In which mode: `mode` when given,
    either one mode for every tag or a dict of tag name to mode (a listed tag missing from it:
    BACKUP); without it, each tag in the mode it was offloaded in when the block began (a DISCARD
    tag, a KV cache, goes back without a backup), BACKUP for a tag that was resident or did not
    exist. This is the shape of one phase of a reinforcement-learning loop:
    ``with tagmem.resident("weights", "kv_cache"): rollout()``.
    """
    if isinstance(mode, dict):
        unknown = sorted(set(mode) - set(names))
        if unknown:
            raise _errors.error_for(
                1, f"resident: mode names {unknown}, which are not among the listed tags {list(names)}"
            )
        modes = {n: _mode(mode.get(n, BACKUP)) for n in names}
    elif mode is not None:
        modes = dict.fromkeys(names, _mode(mode))
    else:
        modes = dict.fromkeys(names, BACKUP)
    present = set(tags(device))
    states = {n: state(n, device) for n in names if n in present}
    if mode is None:
        modes.update({n: DISCARD for n, s in states.items() if s == "offloaded_discard"})
    waiting = [n for n, s in states.items() if s != "resident"]
    if waiting:
        reload(waiting, device)
    try:
        yield
    finally:
        present = set(tags(device))
        leaving = [n for n in names if n in present and state(n, device) == "resident"]
        for how in (BACKUP, DISCARD):
            group = [n for n in leaving if modes[n] == how]
            if group:
                offload(group, how, device)


def trace_flush():
    """Writes the TAGMEM_TRACE file now (whole, valid JSON), with the events so far; does nothing
    when TAGMEM_TRACE was not set. For a long run that is ended otherwise than by exit, SIGTERM or
    SIGINT (those write it already), or to look at the trace while the process runs. Raises
    InvalidArgumentError naming the file when it cannot be written."""
    _errors.check(_lib.lib().tagmem_trace_flush())


def empty_cache(device=None):
    """Returns to the driver the physical memory of resident tags' segments that hold no live
    allocation. Offloaded tags are left alone."""
    _errors.check(_lib.lib().tagmem_empty_cache(_device(device)))


def wait_released(device=None):
    """Waits until the device memory DISCARD offloads and swaps gave up is back with the driver
    (tagmem's own allocations wait for it by themselves; other allocators and processes do not),
    after the offloads that returned early (TAGMEM_OFFLOAD_RETURN=queued) have ended; raises the
    first failure one of them met after returning."""
    _errors.check(_lib.lib().tagmem_wait_released(_device(device)))


def offload_returns_early():
    """Whether offloads return once their copies are queued (TAGMEM_OFFLOAD_RETURN=queued, read
    from the environment as tagmem reads it when it starts)."""
    return os.environ.get("TAGMEM_OFFLOAD_RETURN", "done") == "queued"


def release_physical(device=None):
    """Hands the device memory kept for recycling (TAGMEM_RECYCLE_PHYSICAL=keep) to the background
    release and returns; wait_released() also waits until it is back with the driver."""
    _errors.check(_lib.lib().tagmem_release_physical(_device(device)))


def handoff_expect(nbytes=0, device=None):
    """With TAGMEM_HANDOFF=on: this process will reload about `nbytes` on the device (0: what its
    offloaded tags map), so the job's processes hand it the device memory they give up meanwhile
    instead of returning it to the driver (held at most TAGMEM_HANDOFF_HOLD_MS). The latest call
    wins; a reload covers it. See docs/handoff.md."""
    _errors.check(
        _lib.lib().tagmem_handoff_expect(_device(device), _args.size(nbytes, "nbytes"))
    )


def handoff_cancel(device=None):
    """Stops what handoff_expect() started; memory held for it goes back to the driver."""
    _errors.check(_lib.lib().tagmem_handoff_cancel(_device(device)))


def handoff_stats(device=None):
    """The device's handoff figures as a dict (tagmem_handoff_stats): bytes given, received,
    mapped without creating memory, returned unmapped, held now; peers refused; reload waits."""
    out = _lib.HandoffStats()
    _errors.check(
        _lib.lib().tagmem_handoff_stats_get_sized(
            _device(device), ctypes.byref(out), ctypes.sizeof(out)
        )
    )
    d = _as_dict(out)
    d["listening"] = bool(d["listening"])
    return d


def plan_offload(tag, mode=BACKUP, device=None):
    """Says how `tag` will be offloaded. BACKUP: while it grows, host memory for its backup is
    pinned in the background (within the host budget; TAGMEM_PIN_AHEAD=off turns that off), so
    the first offload copies at once. DISCARD: nothing is pinned for it."""
    _errors.check(_lib.lib().tagmem_tag_plan_offload(_name(tag), _device(device), _mode(mode)))


def host_reserve(nbytes, wait=False):
    """Grows the pinned host store to at least `nbytes` ahead of need (pinning is slow, copying is
    fast). With ``wait=False`` the pinning runs in the background."""
    _errors.check(_lib.lib().tagmem_host_reserve(_args.size(nbytes, "nbytes"), 1 if wait else 0))


def host_trim(keep_bytes=0):
    """Unpins and frees host store memory that holds no backup, keeping at least `keep_bytes`."""
    _errors.check(_lib.lib().tagmem_host_trim(_args.size(keep_bytes, "keep_bytes")))


# ---- statistics -------------------------------------------------------------------------------


def _tag_stats(name, device):
    out = _lib.TagStats()
    _errors.check(
        _lib.lib().tagmem_tag_stats_get_sized(
            _name(name), _device(device), ctypes.byref(out), ctypes.sizeof(out)
        )
    )
    return out


def _as_dict(struct):
    return {field: getattr(struct, field) for field, _ in struct._fields_}


def tags(device=None):
    """The names of the tags that exist on the device."""
    lib = _lib.lib()
    width = _lib.MAX_TAG_NAME + 1
    count = ctypes.c_size_t(0)
    _errors.check(lib.tagmem_list_tags(_device(device), None, 0, ctypes.byref(count)))
    while True:
        capacity = count.value
        buffer = ctypes.create_string_buffer(width * max(1, capacity))
        _errors.check(lib.tagmem_list_tags(_device(device), buffer, capacity, ctypes.byref(count)))
        if count.value <= capacity:  # else a tag appeared meanwhile: ask again
            raw = buffer.raw
            return [raw[i * width : (i + 1) * width].split(b"\0", 1)[0].decode() for i in range(count.value)]


def config_describe():
    """tagmem_config_describe(): one line per TAGMEM_* setting, "NAME ORIGIN VALUE"."""
    lib = _lib.lib()
    needed = ctypes.c_size_t(0)
    while True:
        _errors.check(lib.tagmem_config_describe(None, 0, ctypes.byref(needed)))
        buffer = ctypes.create_string_buffer(needed.value)
        status = lib.tagmem_config_describe(buffer, needed.value, ctypes.byref(needed))
        if status == 0:
            return buffer.value.decode()
        if len(buffer) >= needed.value:  # else the environment grew meanwhile: ask again
            _errors.check(status)


def stats(name=None, device=None):
    """tagmem's statistics as dicts whose keys are the C structs' field names.

    With `name`: that tag's tagmem_tag_stats, ``state`` given as its name ("resident", ...).
    Without: the device's tagmem_device_stats, plus ``"metadata_heap"`` (tagmem_metadata_heap():
    "mimalloc" or "system"), ``"by_tag"``: {tag name: tag stats dict}, and the per-tag keys in
    torch.cuda.memory_stats()'s naming (``allocated_bytes.<tag>.current``, ``.all.current``, ...;
    tagmem.torch.memory_stats()). Under the LD_PRELOAD shim ``"by_tag"`` includes ``"nccl"``,
    NCCL's memory, which only tagmem_nccl_pause/resume move.
    """
    if name is not None:
        out = _as_dict(_tag_stats(name, device))
        out["state"] = _STATES[out["state"]]
        return out
    device_stats = _lib.DeviceStats()
    _errors.check(
        _lib.lib().tagmem_device_stats_get_sized(
            _device(device), ctypes.byref(device_stats), ctypes.sizeof(device_stats)
        )
    )
    out = _as_dict(device_stats)
    out["metadata_heap"] = _lib.lib().tagmem_metadata_heap().decode()
    out["by_tag"] = {}
    for n in tags(device):
        try:
            out["by_tag"][n] = stats(n, device)
        except _errors.UnknownTagError:  # removed meanwhile
            pass
    from . import _summary  # imports this module

    out.update(_summary.torch_named(out["by_tag"]))
    return out


# ---- raw allocations (engines, tests; PyTorch users go through tagmem.torch) ---------------------


def raw_alloc(nbytes, tag=None, device=None, stream=None):
    """Allocates `nbytes` of device memory in `tag` (default: the thread's current tag) and
    returns its address as an int. `stream` is a CUstream/cudaStream_t as an int (None: the
    legacy default stream). Free it with raw_free."""
    size = _args.size(nbytes, "nbytes")
    device = _device(device)
    stream = _args.pointer(stream, "stream")
    lib = _lib.lib()
    ptr = ctypes.c_void_p()
    if tag is None:
        status = lib.tagmem_malloc(ctypes.byref(ptr), size, device, stream)
    else:
        status = lib.tagmem_malloc_tagged(ctypes.byref(ptr), size, _name(tag), device, stream)
    _errors.check(status)
    return ptr.value


def raw_free(ptr, stream=None):
    """Frees an address returned by raw_alloc (allowed while its tag is offloaded)."""
    ptr = _args.pointer(ptr, "ptr")
    stream = _args.pointer(stream, "stream")
    _errors.check(_lib.lib().tagmem_free(ptr, stream))


def pointer_info(ptr):
    """Which allocation holds address `ptr`: {"tag", "device", "base", "size"} (size as
    requested). Raises UnknownPointerError for memory tagmem did not allocate."""
    ptr = _args.pointer(ptr, "ptr")
    name = ctypes.create_string_buffer(_lib.MAX_TAG_NAME + 1)
    device = ctypes.c_int(-1)
    base = ctypes.c_void_p()
    size = ctypes.c_size_t(0)
    _errors.check(
        _lib.lib().tagmem_pointer_info(
            ptr, name, len(name), ctypes.byref(device), ctypes.byref(base), ctypes.byref(size)
        )
    )
    return {"tag": name.value.decode(), "device": device.value, "base": base.value, "size": size.value}


# ---- offloaded bytes on the host ----------------------------------------------------------------

HOST_VIEW_WRITABLE = 1


def host_pieces(ptr, nbytes=None, writable=False):
    """Where the bytes [ptr, ptr + nbytes) of an allocation offloaded with BACKUP wait in pinned
    host memory: a list of (host address, length) pieces in order (tagmem_host_view).

    `nbytes` defaults to the rest of the allocation. With ``writable=True`` the caller may write
    through the pieces and the reload restores what was written. The addresses are valid until
    the tag is reloaded or the allocation freed. Raises TagResidentError when the tag is resident,
    TagOffloadedError when it was offloaded with DISCARD, UnknownPointerError for other memory,
    InvalidArgumentError when `nbytes` runs past the allocation.
    """
    info = pointer_info(ptr)
    left = info["base"] + info["size"] - ptr
    if nbytes is None:
        nbytes = left
    elif not 0 < int(nbytes) <= left:
        raise _errors.error_for(
            1, f"{nbytes!r} bytes at {ptr:#x}: the allocation has {left} bytes from there"
        )
    lib = _lib.lib()
    flags = HOST_VIEW_WRITABLE if writable else 0
    host = ctypes.c_void_p()
    length = ctypes.c_size_t(0)
    pieces = []
    done = 0
    while done < nbytes:
        _errors.check(
            lib.tagmem_host_view(ptr + done, flags, ctypes.byref(host), ctypes.byref(length))
        )
        n = min(length.value, nbytes - done)
        pieces.append((host.value, n))
        done += n
    return pieces


def host_view(ptr, nbytes=None, writable=False):
    """A memoryview of the host bytes of an allocation offloaded with BACKUP (see host_pieces),
    read-only unless `writable`. Raises InvalidArgumentError when the bytes lie in several host
    pieces (read them with host_pieces, or copy them with host_bytes)."""
    pieces = host_pieces(ptr, nbytes, writable)
    if len(pieces) != 1:
        raise _errors.error_for(
            1,
            f"the {sum(n for _, n in pieces)} bytes at {ptr:#x} lie in {len(pieces)} host pieces, "
            "not one: use tagmem.host_pieces() or tagmem.host_bytes()",
        )
    address, n = pieces[0]
    view = memoryview((ctypes.c_char * n).from_address(address)).cast("B")
    return view if writable else view.toreadonly()


def host_bytes(ptr, nbytes=None):
    """A copy (bytes) of the host bytes of an allocation offloaded with BACKUP, across pieces."""
    return b"".join(ctypes.string_at(a, n) for a, n in host_pieces(ptr, nbytes))


def set_keep_backup(name, keep=True, device=None):
    """Makes reloads of tag `name` keep (or give back) its BACKUP host copy
    (tagmem_set_keep_backup): after a keeping reload, host_pieces/host_view/host_bytes read the
    bytes the tag had at its offload, read-only, until the tag allocates or frees, is offloaded
    again or is reloaded without the flag. Raises UnknownTagError for a tag that does not exist."""
    _errors.check(_lib.lib().tagmem_set_keep_backup(_name(name), _device(device), 1 if keep else 0))


def set_unpin_backup(name, unpin=True, device=None):
    """Makes reloads of tag `name` give its BACKUP host memory back to the system (or keep it
    pinned for the next offload, the default) (tagmem_set_unpin_backup): the process's resident
    memory drops after the reload, and the next offload pins anew. Raises UnknownTagError for a
    tag that does not exist."""
    _errors.check(
        _lib.lib().tagmem_set_unpin_backup(_name(name), _device(device), 1 if unpin else 0))


def set_replicated(name, group, rank=None, size=None, device=None):
    """Makes tag `name` a replicated tag (tagmem_set_replicated, docs/replicated.md): the processes
    of this job that name the same tag and `group`, each with its own `rank` of `size`, hold the
    same bytes in the same layout, and its BACKUP offloads keep one host copy for all of them,
    each replica copying only its share. Every replica must offload it (the offload waits for
    them). `group=None` makes the tag plain again. Raises InvalidArgumentError for a bad group,
    rank or size, UnknownTagError for a tag that does not exist, TagOffloadedError while the tag
    is offloaded through the shared copy."""
    if group is None:
        _errors.check(_lib.lib().tagmem_set_replicated(_name(name), _device(device), None, 0, 0))
        return
    rank, size = _args.int32(rank, "rank"), _args.int32(size, "size")
    _errors.check(
        _lib.lib().tagmem_set_replicated(_name(name), _device(device), _name(group), rank, size)
    )


# ---- free-memory margin -------------------------------------------------------------------------


def set_memory_margin(nbytes):
    """Makes tagmem's allocations fail with OutOfMemoryError when they would leave less than
    `nbytes` of free device memory (0 turns the margin off). Process-wide."""
    # Checked like every size: int() would turn 1.9 into 1, and ctypes 2**64 into 0 (no margin).
    _lib.lib().tagmem_set_memory_margin(_args.size(nbytes, "memory margin"))


def memory_margin():
    """The margin set by set_memory_margin (0: none)."""
    return int(_lib.lib().tagmem_memory_margin())


def set_disk_dir(path=None):
    """Sets the directory that offloads in mode DISK write their files to (it must exist; a real
    disk, not tmpfs). None goes back to TAGMEM_DISK_DIR."""
    path = None if path is None else str(path)
    if path is not None and "\0" in path:
        raise _errors.error_for(1, f"disk directory {path!r} contains a NUL character")
    raw = None if path is None else path.encode()
    _errors.check(_lib.lib().tagmem_set_disk_dir(raw))


def set_disk_file_bytes(nbytes=0):
    """Sets the largest file a DISK offload writes (a multiple of 1 MiB; 0: TAGMEM_DISK_FILE_BYTES)."""
    _errors.check(_lib.lib().tagmem_set_disk_file_bytes(_args.size(nbytes)))
