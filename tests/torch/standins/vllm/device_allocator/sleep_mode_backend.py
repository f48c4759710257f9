"""Stand-in for vLLM's sleep-mode backend registry (tests only), shaped as vLLM's: an abstract
backend class, and a factory whose register_backend(name, module_path, class_name) refuses a name
registered already and resolves classes lazily; create_backend() selects by the model config's
``sleep_mode_backend``, checks ``is_supported()`` and instantiates with no arguments. Unlike
vLLM's, it needs no PyTorch."""

import importlib
from abc import ABC, abstractmethod


class SleepModeBackend(ABC):
    def __init__(self):
        self._state = "RUNNING"

    @abstractmethod
    def suspend(self, level=1):
        raise NotImplementedError

    @abstractmethod
    def resume(self, tags=None):
        raise NotImplementedError

    def state(self):
        return self._state

    def discard(self, tags):
        raise RuntimeError(f"{type(self).__name__} does not support selective discard")

    @classmethod
    def is_supported(cls):
        return True

    @classmethod
    def preserves_communicators(cls):
        return False


class CuMemBackend(SleepModeBackend):
    def suspend(self, level=1):
        from vllm.device_allocator import get_mem_allocator_instance

        get_mem_allocator_instance().sleep(offload_tags=("weights",) if level == 1 else ())

    def resume(self, tags=None):
        from vllm.device_allocator import get_mem_allocator_instance

        get_mem_allocator_instance().wake_up(tags)


class SleepModeBackendFactory:
    _registry = {}

    @classmethod
    def register_backend(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Sleep-mode backend '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader

    @classmethod
    def get_backend_class(cls, name):
        if name not in cls._registry:
            raise ValueError(f"Unsupported sleep-mode backend '{name}'.")
        return cls._registry[name]()

    @classmethod
    def create_backend(cls, model_config):
        backend_cls = cls.get_backend_class(model_config.sleep_mode_backend)
        if not backend_cls.is_supported():
            raise ValueError(
                f"Sleep-mode backend '{model_config.sleep_mode_backend}' is not supported on "
                "this platform."
            )
        return backend_cls()


SleepModeBackendFactory.register_backend(
    "cumem", "vllm.device_allocator.sleep_mode_backend", "CuMemBackend"
)
