"""Per-tag memory statistics in PyTorch's shapes (torch-free; tagmem.torch re-exports them).

memory_stats() returns a flat dict keyed as torch.cuda.memory_stats() is, with the tag in the
place where PyTorch puts its pool ("all", "small_pool", "large_pool"): ``allocated_bytes.<tag>.
current`` and ``.peak``, ``reserved_bytes``, ``requested_bytes``, ``allocation.<tag>.current`` /
``.allocated`` / ``.freed``. Keys with no PyTorch counterpart use tagmem's names in the same shape:
``mapped_bytes`` (resident), ``offloaded_bytes`` (reserved but not mapped), ``host_bytes`` (the
pinned backup), ``offload_count`` / ``reload_count``. ``<metric>.all.current`` sums the tags; there
is no ``.all.peak`` (tagmem keeps peaks per tag, and the peak of a sum is not the sum of peaks).
A tag whose own name is "all" appears as ``[all]`` (Note [tag names beside the totals]).
memory_summary() prints them in the layout of torch.cuda.memory_summary(). tagmem.stats() (and
so tagmem.torch.stats()) carries the same keys beside the C structs' names.
"""

from . import _api

_UNITS = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]


def _size(n):
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return "%6.2f %s" % (n, unit) if unit != "B  " else "%6d %s" % (n, unit)
        n /= 1024


def memory_stats(device=None):
    """torch.cuda.memory_stats()-shaped statistics of every tag on `device` (see the module)."""
    return torch_named(_api.stats(None, device)["by_tag"])


TOTAL = "all"


def key_name(tag):
    """The name tag `tag` has in memory_stats() keys.

    Note [tag names beside the totals]: the totals take PyTorch's pool name "all", which is also a
    valid tag name; a tag so named would have its keys overwritten by the sums. Such a tag, and
    any name already in brackets, is written in brackets ("all" -> "[all]", "[all]" -> "[[all]]"),
    so every tag keeps keys of its own and no two tags share one."""
    if tag == TOTAL or (tag.startswith("[") and tag.endswith("]")):
        return f"[{tag}]"
    return tag


def torch_named(by_tag):
    """The memory_stats() dict of `by_tag` ({tag name: tagmem.stats(tag) dict})."""
    out = {}
    sums = {}
    for tag, s in sorted(by_tag.items()):
        name = key_name(tag)
        offloaded = max(0, s["reserved_bytes"] - s["mapped_bytes"]) if s["state"] != "resident" else 0
        per_tag = {
            "allocated_bytes.%s.current": s["allocated_bytes"],
            "allocated_bytes.%s.peak": s["peak_allocated_bytes"],
            "requested_bytes.%s.current": s["requested_bytes"],
            "reserved_bytes.%s.current": s["reserved_bytes"],
            "mapped_bytes.%s.current": s["mapped_bytes"],
            "mapped_bytes.%s.peak": s["peak_mapped_bytes"],
            "offloaded_bytes.%s.current": offloaded,
            "host_bytes.%s.current": s["host_bytes"],
            "allocation.%s.current": s["live_allocations"],
            "allocation.%s.allocated": s["alloc_count"],
            "allocation.%s.freed": s["free_count"],
            "offload_count.%s": s["offload_count"],
            "reload_count.%s": s["reload_count"],
        }
        for key, value in per_tag.items():
            out[key % name] = value
            if key.endswith(".current"):
                sums[key % TOTAL] = sums.get(key % TOTAL, 0) + value
    out.update(sums)
    return out


def memory_summary(device=None):
    """A table per tag in the layout of torch.cuda.memory_summary(): current and peak usage."""
    st = _api.stats(None, device)
    width = 75
    rule = "|" + "=" * width + "|"
    thin = "|" + "-" * width + "|"

    def row(cells):
        return "| %-22s| %-14s| %-14s| %-18s|" % tuple(cells)

    lines = [rule, "|{:^{w}}|".format("tagmem memory summary, device ID %s" % (
        "current" if device is None else device), w=width), thin]
    lines.append("|{:<{w}}|".format("  device free: %s of %s" % (
        _size(st["device_free_bytes"]).strip(), _size(st["device_total_bytes"]).strip()), w=width))
    lines.append("|{:<{w}}|".format("  pinned host: %s, %s of it holding backups" % (
        _size(st["host_pinned_bytes"]).strip(), _size(st["host_used_bytes"]).strip()), w=width))
    lines += [rule, row(["Tag / metric", " Cur Usage", " Peak Usage", " State"]), thin]
    for name, s in sorted(st["by_tag"].items()):
        offloaded = max(0, s["reserved_bytes"] - s["mapped_bytes"]) if s["state"] != "resident" else 0
        lines.append(row([name[:22], "", "", " " + s["state"].replace("offloaded_", "offloaded/")]))
        lines.append(row(["  allocated", _size(s["allocated_bytes"]),
                          _size(s["peak_allocated_bytes"]), ""]))
        lines.append(row(["  reserved", _size(s["reserved_bytes"]), "", ""]))
        lines.append(row(["  resident (mapped)", _size(s["mapped_bytes"]),
                          _size(s["peak_mapped_bytes"]), ""]))
        lines.append(row(["  offloaded", _size(offloaded), "", ""]))
        lines.append(row(["  host backup", _size(s["host_bytes"]), "", ""]))
        lines.append(row(["  allocations", "%10d    " % s["live_allocations"], "",
                          " %d off/%d re" % (s["offload_count"], s["reload_count"])]))
        lines.append(thin)
    lines[-1] = rule
    return "\n".join(lines) + "\n"
