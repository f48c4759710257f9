"""torch_memory_saver's modules, attributes and exception types as public callers use them,
answered by tagmem's drop-in (``import torch_memory_saver`` after install()). Each test names the
caller it stands for; the code here is written for the test, not taken from the caller.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed: where a
caller's code path touches PyTorch, the child replaces the drop-in's torch hooks with stand-ins).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tagmem import _preload
from tagmem.compat import _tms_env

# The drop-in's torch hooks replaced for a torch-free child: one device, no pools to speak of.
FAKE_TORCH = """
    import contextlib, types
    from tagmem.compat import torch_memory_saver as dropin
    _cuda = types.SimpleNamespace(
        device_count=lambda: 1, synchronize=lambda device=None: None, current_device=lambda: 0,
        MemPool=lambda *a, **k: object(), use_mem_pool=lambda pool: contextlib.nullcontext())
    dropin._torch = lambda: types.SimpleNamespace(cuda=_cuda)
"""


def run_child(code, env_changes=()):
    env = dict(os.environ)
    env.update({_tms_env.ENABLE_VARIABLE: "1",
                "PYTHONPATH": os.pathsep.join([_tms_env.shim_path()] + [p for p in sys.path if p])})
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FAKE_TORCH) + textwrap.dedent(code)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_missing_hook_library_is_the_runtime_error_slime_catches(tmp_path):
    # THUDM/slime, resolve_preload_library() beside patch_nested_regions(): calls
    # torch_memory_saver.utils.get_binary_path_from_package("torch_memory_saver_hook_mode_preload")
    # and falls back on `except (ImportError, RuntimeError)`.
    child = run_child(
        """
        import json
        from torch_memory_saver.utils import get_binary_path_from_package
        try:
            get_binary_path_from_package("torch_memory_saver_hook_mode_preload")
            print(json.dumps("found"))
        except (ImportError, RuntimeError) as e:
            print(json.dumps(type(e).__name__))
        """,
        {"TAGMEM_PRELOAD_LIBRARY": str(tmp_path / "missing" / "libtagmem_preload.so")},
    )
    assert child == "PreloadLibraryNotFound"


def test_slimes_nested_regions_patch_routes_each_level_into_its_tag():
    # THUDM/slime, patch_nested_regions(): imports _TorchMemorySaverImpl from
    # torch_memory_saver.entrypoint, replaces its _with_region_config with one that reads
    # impl._binary_wrapper.cdll.tms_get_interesting_region() / tms_get_enable_cpu_backup() and
    # sets impl._binary_wrapper.set_config(tag=, interesting_region=, enable_cpu_backup=).
    # THUDM/slime slime/ray/actor_group.py starts the trainer with TMS_INIT_ENABLE=1 and
    # TMS_INIT_ENABLE_CPU_BACKUP=1 under the hook library.
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    child = run_child(
        """
        import contextlib, ctypes, json
        import tagmem
        from torch_memory_saver import torch_memory_saver
        from torch_memory_saver.entrypoint import _TorchMemorySaverImpl

        @contextlib.contextmanager
        def nested(impl, tag, enable_cpu_backup):  # what such a patch does
            cdll = impl._binary_wrapper.cdll
            active = bool(cdll.tms_get_interesting_region())
            backup = bool(cdll.tms_get_enable_cpu_backup())
            outer = cdll.tms_get_current_tag().decode()
            impl._binary_wrapper.set_config(tag=tag, interesting_region=True,
                                            enable_cpu_backup=enable_cpu_backup)
            try:
                yield
            finally:
                impl._binary_wrapper.set_config(tag=outer, interesting_region=active,
                                                enable_cpu_backup=backup)

        _TorchMemorySaverImpl._with_region_config = nested
        malloc = ctypes.CDLL(None).cudaMalloc
        malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        def owner():
            p = ctypes.c_void_p()
            assert malloc(ctypes.byref(p), 1 << 20) == 0
            return tagmem.pointer_info(p.value)["tag"]
        seen = [owner()]
        with torch_memory_saver.region(tag="params", enable_cpu_backup=True):
            seen.append(owner())
            with torch_memory_saver.region(tag="grads", enable_cpu_backup=False):
                seen.append(owner())
            seen.append(owner())
        seen.append(owner())
        torch_memory_saver.pause()
        print(json.dumps({"owners": seen, "mode": torch_memory_saver.hook_mode,
                          "states": {t: tagmem.state(t) for t in ("default", "params", "grads")}}))
        """,
        {"LD_PRELOAD": shim, "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
    )
    assert child["mode"] == "preload"
    assert child["owners"] == ["default", "params", "grads", "params", "default"]
    assert child["states"] == {"default": "offloaded_backup", "params": "offloaded_backup",
                               "grads": "offloaded_discard"}


def test_a_region_exit_restores_a_backend_named_while_backup_is_off():
    # A preload-mode region saves the thread's configuration (backup off, the default backend
    # named) and sets it back on exit through _binary_wrapper.set_config, which, as
    # torch_memory_saver's, takes each value on its own.
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    child = run_child(
        """
        import json
        from torch_memory_saver import torch_memory_saver
        torch_memory_saver._ensure_initialized()
        impl = torch_memory_saver._impl
        cdll = impl._binary_wrapper.cdll
        seen = []
        with impl._with_region_config(tag="weights", enable_cpu_backup=True,
                                      cpu_backup_backend="mmap"):
            seen.append([cdll.tms_get_current_tag().decode(),
                         bool(cdll.tms_get_enable_cpu_backup()),
                         cdll.tms_get_cpu_backup_backend().decode()])
        seen.append([cdll.tms_get_current_tag().decode(), bool(cdll.tms_get_enable_cpu_backup()),
                     cdll.tms_get_cpu_backup_backend().decode()])
        impl._binary_wrapper.set_config(tag="kv", interesting_region=False,
                                        enable_cpu_backup=False, cpu_backup_backend="pinned")
        seen.append([cdll.tms_get_current_tag().decode(), bool(cdll.tms_get_enable_cpu_backup()),
                     cdll.tms_get_cpu_backup_backend().decode()])
        try:
            impl._binary_wrapper.set_config(tag="kv", interesting_region=False,
                                            enable_cpu_backup=True, cpu_backup_backend="disk")
            seen.append("accepted")
        except ValueError as e:
            seen.append("ValueError")
        print(json.dumps(seen))
        """,
        {"LD_PRELOAD": shim, "TMS_INIT_ENABLE": "1"},
    )
    assert child == [["weights", True, "mmap"], ["default", False, "pinned"],
                     ["kv", False, "pinned"], "ValueError"]


def test_dynamos_patch_adds_a_hook_mode_of_its_own():
    # ai-dynamo/dynamo components/src/dynamo/sglang/gpu_memory_service_adapters/
    # torch_memory_saver_patch.py replaces torch_memory_saver.entrypoint.TorchMemorySaver.
    # _ensure_initialized with one that reads self._impl_ctor_kwargs.get("hook_mode"), sets
    # self._impl itself, deletes _impl_ctor_kwargs and returns None;
    # .../torch_memory_saver_impl.py subclasses torch_memory_saver.hooks.base.HookUtilBase.
    child = run_child(
        """
        import json
        import torch_memory_saver.entrypoint as entrypoint
        from torch_memory_saver.hooks.base import HookUtilBase

        class NoBinary(HookUtilBase):
            def get_path_binary(self):
                return None

        calls = []
        class Impl:
            def pause(self, tag):
                calls.append(("pause", tag))
            def resume(self, tag):
                calls.append(("resume", tag))

        original = entrypoint.TorchMemorySaver._ensure_initialized
        def patched(self):
            if self._impl is not None:
                return
            if self._impl_ctor_kwargs.get("hook_mode") == "service":
                self._impl = Impl()
                del self._impl_ctor_kwargs
            else:
                original(self)
        entrypoint.TorchMemorySaver._ensure_initialized = patched
        saver = entrypoint.TorchMemorySaver()
        saver.hook_mode = "service"
        saver.pause("weights")
        saver.resume(None)
        print(json.dumps({"calls": calls, "binary": NoBinary().get_path_binary(),
                          "allocator": NoBinary().get_allocator()}))
        """
    )
    assert child == {"calls": [["pause", "weights"], ["resume", None]], "binary": None,
                     "allocator": None}


def test_configure_subprocess_finds_the_hook_library_through_mode_preload_where_tests_patch_it():
    # fzyzcjy/torch_memory_saver test/test_configure_subprocess.py patches
    # torch_memory_saver.hooks.mode_preload.get_binary_path_from_package with unittest.mock and
    # expects configure_subprocess() to put the patched path first on LD_PRELOAD, keep the entries
    # there and restore the value on exit; torch_memory_saver.configure_subprocess is that same
    # function. The patched path here is a random one that exists nowhere.
    child = run_child(
        """
        import json, os, random
        from unittest import mock
        import torch_memory_saver
        from torch_memory_saver.hooks import mode_preload
        fake = "/nowhere/%08x/torch_memory_saver_hook_mode_preload.so" % random.getrandbits(32)
        out = {"same": torch_memory_saver.configure_subprocess is mode_preload.configure_subprocess}
        os.environ["LD_PRELOAD"] = "/other/lib.so"
        with mock.patch("torch_memory_saver.hooks.mode_preload.get_binary_path_from_package",
                        return_value=fake):
            with torch_memory_saver.configure_subprocess():
                out["inside"] = os.environ["LD_PRELOAD"]
        out["after"] = os.environ["LD_PRELOAD"]
        out["fake"] = fake
        print(json.dumps(out))
        """
    )
    assert child["same"]
    assert child["inside"] == f"{child['fake']}:/other/lib.so"
    assert child["after"] == "/other/lib.so"


def test_torch_memory_saver_utils_has_the_helpers_its_own_tests_import():
    # fzyzcjy/torch_memory_saver test/test_examples.py: `from torch_memory_saver.utils import
    # change_env` around each example, and testing_utils' is_xpu() from the same module.
    child = run_child(
        """
        import json, os
        from torch_memory_saver.utils import change_env, is_xpu
        os.environ.pop("TMS_PROBE_VARIABLE", None)
        os.environ["TMS_PROBE_KEPT"] = "before"
        with change_env("TMS_PROBE_VARIABLE", "1"), change_env("TMS_PROBE_KEPT", "inside"):
            inside = [os.environ["TMS_PROBE_VARIABLE"], os.environ["TMS_PROBE_KEPT"]]
        print(json.dumps({"inside": inside, "unset": "TMS_PROBE_VARIABLE" not in os.environ,
                          "kept": os.environ["TMS_PROBE_KEPT"], "xpu": is_xpu()}))
        """
    )
    assert child == {"inside": ["1", "inside"], "unset": True, "kept": "before", "xpu": False}


def test_the_drop_in_and_the_shims_c_functions_share_one_configuration_and_one_pause(rng):
    # fzyzcjy/torch_memory_saver test/examples/nested_region.py (TMS_INIT_ENABLE=1 and
    # TMS_INIT_ENABLE_CPU_BACKUP=1, preload mode) reads the thread's configuration through
    # _impl._binary_wrapper.cdll inside and after region(); cuda_vmm_granularity.py calls
    # tms_pause / tms_resume straight from the process (ctypes.CDLL(None)) with NULL.
    shim = _preload.library()
    assert shim, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    seed = rng.getrandbits(32)
    child = run_child(
        f"""
        import ctypes, json, random, sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import tagmem
        from device_io import DeviceIO
        from torch_memory_saver import torch_memory_saver as saver
        io, rng = DeviceIO(0), random.Random({seed})
        process = ctypes.CDLL(None)
        malloc_fn = process.cudaMalloc
        malloc_fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        def filled(n):
            p = ctypes.c_void_p()
            assert malloc_fn(ctypes.byref(p), n) == 0
            data = rng.randbytes(n)
            io.write(p.value, data)
            return p.value, data
        saver.hook_mode = "preload"
        saver._ensure_initialized()
        cdll = saver._impl._binary_wrapper.cdll
        state = lambda: [cdll.tms_get_interesting_region(), cdll.tms_get_enable_cpu_backup(),
                         cdll.tms_get_current_tag().decode(),
                         cdll.tms_get_cpu_backup_backend().decode()]
        out = {{"init": state()}}
        w, dw = filled(6912)
        with saver.region(tag="grads", enable_cpu_backup=False):
            out["inside"] = state()
            g, dg = filled(2 << 20)
        with saver.region(tag="mm", enable_cpu_backup=True, cpu_backup_backend="mmap"):
            out["mmap"] = state()
            m, dm = filled(1 << 20)
        out["after"] = state()
        pause, resume = process.tms_pause, process.tms_resume
        pause.argtypes = resume.argtypes = [ctypes.c_char_p]
        out["c_pause"] = pause(None)
        out["states"] = [tagmem.state(t) for t in ("default", "grads", "mm")]
        out["python_pause"] = None
        try:
            saver.pause("grads")  # paused by the C call: the drop-in sees it
        except tagmem.TagOffloadedError as e:
            out["python_pause"] = e.status
        saver.resume()
        out["bytes"] = [io.read(w, len(dw)) == dw, io.read(m, len(dm)) == dm]
        saver.pause("default")
        out["c_resume"] = resume(b"default")
        out["default"] = io.read(w, len(dw)) == dw
        print(json.dumps(out))
        """,
        {"LD_PRELOAD": shim, "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
    )
    assert child["init"] == [True, True, "default", "pinned"]
    assert child["inside"] == [True, False, "grads", "pinned"]
    assert child["mmap"] == [True, True, "mm", "mmap"]
    assert child["after"] == child["init"]
    assert child["c_pause"] == 0
    assert child["states"] == ["offloaded_backup", "offloaded_discard", "offloaded_backup"]
    assert child["python_pause"] == 3
    assert child["bytes"] == [True, True]
    assert child["c_resume"] == 0 and child["default"]


def test_a_torch_mode_region_config_leaves_later_regions_tracked():
    # torch_memory_saver's cpu_backup example frees a region's tensor inside
    # _impl._with_region_config in torch mode, then opens another region on the same thread: that
    # region's allocations must still go to tagmem (the exit used to switch tracking off).
    child = run_child(
        """
        import json
        from torch_memory_saver import torch_memory_saver
        torch_memory_saver._ensure_initialized()
        impl = torch_memory_saver._impl
        seen = [impl.hook_mode]
        with impl._with_region_config(tag="freed", enable_cpu_backup=True,
                                      cpu_backup_backend="pinned"):
            seen.append(impl.interesting())
        seen.append(getattr(impl._local, "off", False))
        with impl.disable():
            with impl._with_region_config(tag="inner", enable_cpu_backup=False):
                pass
            seen.append(getattr(impl._local, "off", False))
        seen.append(getattr(impl._local, "off", False))
        print(json.dumps(seen))
        """
    )
    assert child == ["torch", False, False, True, False]

