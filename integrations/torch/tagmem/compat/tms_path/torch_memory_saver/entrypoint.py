"""torch_memory_saver.entrypoint under tagmem: the classes callers import from it and patch.
_TorchMemorySaverImpl is the implementation TorchMemorySaver builds at first use (its
_with_region_config, _binary_wrapper.set_config and _binary_wrapper.cdll are what patches use)."""

from tagmem.compat.torch_memory_saver import _TAG_DEFAULT, TorchMemorySaver  # noqa: F401
from tagmem.compat.torch_memory_saver import _Impl as _TorchMemorySaverImpl  # noqa: F401
