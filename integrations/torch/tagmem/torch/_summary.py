"""tagmem.torch.memory_summary() / memory_stats(): tagmem._summary on tagmem.torch's device.

`device` defaults to torch.cuda.current_device(), as everywhere in tagmem.torch.
"""

from .. import _summary
from ._pools import device_index


def memory_stats(device=None):
    """torch.cuda.memory_stats()-shaped per-tag statistics (tagmem._summary.memory_stats)."""
    return _summary.memory_stats(device_index(device))


def memory_summary(device=None):
    """Per-tag table in the layout of torch.cuda.memory_summary()."""
    return _summary.memory_summary(device_index(device))
