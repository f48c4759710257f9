"""``torch_memory_saver`` answered by tagmem (tagmem.compat.torch_memory_saver), or the real
package when TAGMEM_AS_TORCH_MEMORY_SAVER is not 1 (see tagmem/compat/_tms_env.py)."""

import os as _os
import sys as _sys

if _os.environ.get("TAGMEM_AS_TORCH_MEMORY_SAVER") == "1":
    from tagmem.compat.torch_memory_saver import *  # noqa: F401,F403
    from tagmem.compat.torch_memory_saver import __all__  # noqa: F401

    # The one in hooks.mode_preload, as in torch_memory_saver: it finds the hook library through
    # that module's get_binary_path_from_package, which callers patch there.
    from .hooks.mode_preload import configure_subprocess  # noqa: F401

    __tagmem__ = True
else:  # step aside for whatever torch_memory_saver is installed
    _here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    del _sys.modules[__name__]
    import importlib as _importlib

    _sys.modules[__name__] = _importlib.import_module(__name__)
