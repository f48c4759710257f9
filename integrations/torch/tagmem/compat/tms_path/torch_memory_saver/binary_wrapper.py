"""torch_memory_saver.binary_wrapper under tagmem: BinaryWrapper is the object an implementation
holds as ``_binary_wrapper`` (``cdll`` and ``set_config``); tagmem has no library to load."""

from tagmem.compat.torch_memory_saver import _BinaryWrapper as BinaryWrapper  # noqa: F401
