"""torch_memory_saver.hooks.base under tagmem: the base class patches subclass to add a hook mode
of their own. tagmem's implementation does not use hook utilities, so create() is refused."""

from abc import ABC
from typing import Literal

HookMode = Literal["preload", "torch"]


class HookUtilBase(ABC):
    @staticmethod
    def create(hook_mode):
        raise NotImplementedError(
            f"hook_mode {hook_mode!r}: tagmem's torch_memory_saver implements its hook modes "
            "itself; set torch_memory_saver.hook_mode instead"
        )

    def get_path_binary(self):
        raise NotImplementedError

    def get_allocator(self):
        return None
