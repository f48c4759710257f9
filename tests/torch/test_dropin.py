"""The drop-ins' torch-free parts: offloaded bytes on the host (tagmem.host_*), the memory margin,
torch_memory_saver importable under its own name (opt-in, stepping aside otherwise), the preload
shim handed to subprocesses and its per-thread region tracking, and vLLM's allocator module
replaced with a stand-in vLLM package.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
TAGMEM_PRELOAD_LIBRARY names libtagmem_preload.so (ctest and gpu_run.sh set it).
"""

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

import tagmem
from conftest import REPO_ROOT
from tagmem.compat import _tms_env

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "standins")
PACKAGE = os.path.join(REPO_ROOT, "integrations", "torch")


def fill(io, rng, address, nbytes):
    data = rng.randbytes(nbytes)
    io.write(address, data)
    return data


# ---- offloaded bytes on the host ----------------------------------------------------------------


def test_host_bytes_of_a_backed_up_allocation_match_exactly_and_writes_are_restored(io, rng):
    sizes = [1000, 3 * MiB + 17, 300]
    pointers = [tagmem.raw_alloc(n, tag="w") for n in sizes]
    data = [fill(io, rng, p, n) for p, n in zip(pointers, sizes)]
    tagmem.offload("w")
    for p, n, d in zip(pointers, sizes, data):
        assert tagmem.host_bytes(p) == d
        offset = rng.randrange(n)
        assert tagmem.host_bytes(p + offset) == d[offset:]
        assert tagmem.host_bytes(p + offset, n - offset) == d[offset:]
        pieces = tagmem.host_pieces(p)
        assert sum(length for _, length in pieces) == n
        assert b"".join(ctypes.string_at(a, length) for a, length in pieces) == d
    view = tagmem.host_view(pointers[0])
    assert view.readonly and bytes(view) == data[0]
    with pytest.raises(TypeError):
        view[0] = 1
    new = rng.randbytes(sizes[0])
    writable = tagmem.host_view(pointers[0], writable=True)
    writable[:] = new
    with pytest.raises(tagmem.InvalidArgumentError):
        tagmem.host_pieces(pointers[2], sizes[2] + 1)  # past the allocation
    tagmem.reload("w")
    assert io.read(pointers[0], sizes[0]) == new
    assert io.read(pointers[1], sizes[1]) == data[1]


def test_host_views_refuse_resident_discarded_and_foreign_memory(io, rng):
    p = tagmem.raw_alloc(MiB, tag="kv")
    fill(io, rng, p, MiB)
    with pytest.raises(tagmem.TagResidentError):
        tagmem.host_pieces(p)
    tagmem.offload("kv", mode="discard")
    with pytest.raises(tagmem.TagOffloadedError, match="DISCARD"):
        tagmem.host_view(p)
    with pytest.raises(tagmem.UnknownPointerError):
        tagmem.host_bytes(id(p))


def test_a_kept_backup_is_read_after_reload_until_the_next_offload_replaces_it(io, rng):
    sizes = [4096, 2 * MiB + 5]
    pointers = [tagmem.raw_alloc(n, tag="kept") for n in sizes]
    data = [fill(io, rng, p, n) for p, n in zip(pointers, sizes)]
    tagmem.set_keep_backup("kept")
    tagmem.offload("kept")
    tagmem.reload("kept")
    assert [tagmem.host_bytes(p) for p in pointers] == data
    newer = fill(io, rng, pointers[0], sizes[0])
    assert tagmem.host_bytes(pointers[0]) == data[0]  # a snapshot of the offload
    with pytest.raises(tagmem.TagResidentError, match="read-only"):
        tagmem.host_pieces(pointers[0], writable=True)
    tagmem.offload("kept")
    assert tagmem.host_bytes(pointers[0]) == newer
    tagmem.set_keep_backup("kept", False)
    tagmem.reload("kept")
    with pytest.raises(tagmem.TagResidentError):
        tagmem.host_bytes(pointers[1])
    assert tagmem.stats("kept")["host_bytes"] == 0
    assert io.read(pointers[0], sizes[0]) == newer and io.read(pointers[1], sizes[1]) == data[1]
    with pytest.raises(tagmem.UnknownTagError):
        tagmem.set_keep_backup("no-such-tag")


def test_memory_margin_refuses_allocations_that_would_cross_it(io):
    warm = tagmem.raw_alloc(1, tag="m")
    free = io.free_bytes()
    try:
        tagmem.set_memory_margin(free - 64 * MiB)
        assert tagmem.memory_margin() == free - 64 * MiB
        with pytest.raises(tagmem.OutOfMemoryError, match="margin"):
            tagmem.raw_alloc(256 * MiB, tag="m")
        small = tagmem.raw_alloc(MiB, tag="m")
        with pytest.raises(tagmem.InvalidArgumentError):
            tagmem.set_memory_margin(-1)
    finally:
        tagmem.set_memory_margin(0)
    big = tagmem.raw_alloc(256 * MiB, tag="m")
    for q in (warm, small, big):
        tagmem.raw_free(q)


# ---- torch_memory_saver under its own name -------------------------------------------------------


def run_python(code, env_changes, cwd=None):
    """Runs `code` in a fresh interpreter with the environment changed; returns its last stdout
    line parsed as JSON (asserting it exited 0)."""
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd or HERE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def clean_install():
    """Leaves sys.path and the environment as they were after install() ran in this process."""
    saved_path = list(sys.path)
    saved_env = {k: os.environ.get(k) for k in ("PYTHONPATH", _tms_env.ENABLE_VARIABLE)}
    yield
    _tms_env.uninstall()
    sys.path[:] = saved_path
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    sys.modules.pop("torch_memory_saver", None)


def test_install_makes_the_module_importable_here_and_in_subprocesses(clean_install):
    from tagmem.compat import torch_memory_saver as dropin

    dropin.install()
    dropin.install()  # idempotent
    assert os.environ[_tms_env.ENABLE_VARIABLE] == "1"
    assert os.environ["PYTHONPATH"].split(":").count(_tms_env.shim_path()) == 1
    import torch_memory_saver

    assert torch_memory_saver.__tagmem__
    assert torch_memory_saver.torch_memory_saver is dropin.torch_memory_saver
    child = run_python(
        """
        import json, torch_memory_saver as t
        from torch_memory_saver.hooks.mode_preload import configure_subprocess
        print(json.dumps([t.__tagmem__, t.torch_memory_saver.enabled,
                          t.configure_subprocess is configure_subprocess]))
        """,
        {},
    )
    assert child == [True, True, True]


def test_without_the_variable_the_shim_steps_aside_for_the_real_package(tmp_path):
    real = tmp_path / "real" / "torch_memory_saver"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("WHO = 'the real package'\n")
    path = f"{_tms_env.shim_path()}:{PACKAGE}:{tmp_path / 'real'}"
    child = run_python(
        "import json, torch_memory_saver as t; print(json.dumps(t.WHO))",
        {"PYTHONPATH": path, _tms_env.ENABLE_VARIABLE: None},
    )
    assert child == "the real package"
    with pytest.raises(AssertionError, match="ModuleNotFoundError"):
        run_python("import torch_memory_saver", {"PYTHONPATH": f"{_tms_env.shim_path()}:{PACKAGE}",
                                                 _tms_env.ENABLE_VARIABLE: "0"})


def test_install_refuses_when_another_torch_memory_saver_is_imported(clean_install, monkeypatch):
    from tagmem.compat import torch_memory_saver as dropin

    monkeypatch.setitem(sys.modules, "torch_memory_saver", type(sys)("torch_memory_saver"))
    with pytest.raises(ImportError, match="before the engine imports it"):
        dropin.install()


def test_backup_arguments_are_checked_and_retention_is_a_setting(monkeypatch):
    from tagmem.compat.torch_memory_saver import TorchMemorySaver

    saver = TorchMemorySaver()
    with pytest.raises(ValueError, match="mutually exclusive"):
        with saver.region(tag="x", enable_cpu_backup=True, enable_disk_backup=True):
            pass
    with pytest.raises(ValueError, match="requires enable_cpu_backup"):
        with saver.region(cpu_backup_backend="pinned"):
            pass
    saver.hook_mode = "torch"
    unknown = TorchMemorySaver()
    unknown.hook_mode = "other"  # stored as given (patches add modes), checked at first use
    with pytest.raises(ValueError, match="other"):
        unknown.pause()
    assert saver.retain_cpu_backup is False
    saver.retain_cpu_backup = True
    assert saver.retain_cpu_backup is True
    saver.retain_cpu_backup = False
    assert saver.retain_cpu_backup is False
    with pytest.raises(RuntimeError, match="before first use"):
        saver.hook_mode = "preload"
    saver.memory_margin_bytes = 12345
    assert tagmem.memory_margin() == 12345
    tagmem.set_memory_margin(0)
    monkeypatch.setenv("TMS_RETAIN_CPU_BACKUP", "1")
    assert TorchMemorySaver().retain_cpu_backup is True


# ---- preload hook mode ----------------------------------------------------------------------------


def preload_library():
    path = _tms_env.preload_library()
    assert path, "set TAGMEM_PRELOAD_LIBRARY to libtagmem_preload.so (ctest and gpu_run.sh do)"
    return path


CHILD_REGION = """
    import ctypes, json, tagmem
    import torch_memory_saver as tms
    from torch_memory_saver.utils import get_binary_path_from_package
    from tagmem.compat import _tms_env
    saver = tms.torch_memory_saver
    cdll = saver._ensure_initialized()._binary_wrapper.cdll
    cuda_malloc = ctypes.CDLL(None).cudaMalloc
    cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    def malloc(n):
        p = ctypes.c_void_p()
        assert cuda_malloc(ctypes.byref(p), n) == 0
        return p.value
    out = {"mode": saver.hook_mode, "origin": tagmem.library_origin(),
           "binary": get_binary_path_from_package("torch_memory_saver_hook_mode_preload"),
           "init": cdll.tms_get_interesting_region()}
    with tagmem.tag("weights"):
        previous = _tms_env.set_thread_routing(_tms_env.ROUTE_ON)
        out["in_region"] = cdll.tms_get_interesting_region()
        p = malloc(3 << 20)
        out["owner"] = tagmem.pointer_info(p)["tag"]
        cdll.tms_set_interesting_region(False)
        out["switched_off"] = cdll.tms_get_interesting_region()
        _tms_env.set_thread_routing(previous)
    print(json.dumps(out))
"""


def test_configure_subprocess_starts_children_under_the_shim(clean_install):
    from tagmem.compat import torch_memory_saver as dropin

    library = preload_library()
    dropin.install()
    before = os.environ.get("LD_PRELOAD")
    with dropin.configure_subprocess():
        assert os.environ["LD_PRELOAD"].split(":")[0] == library
        child = run_python(CHILD_REGION, {})
    assert os.environ.get("LD_PRELOAD") == before
    assert child["mode"] == "preload" and child["origin"] == "process"
    assert os.path.realpath(child["binary"]) == os.path.realpath(library)
    assert child["init"] is False and child["in_region"] is True
    assert child["owner"] == "weights" and child["switched_off"] is False


def test_tms_init_enable_makes_every_thread_interesting_until_switched_off(clean_install):
    from tagmem.compat import torch_memory_saver as dropin

    dropin.install()
    child = run_python(
        """
        import json, threading
        import torch_memory_saver as tms
        cdll = tms.torch_memory_saver._ensure_initialized()._binary_wrapper.cdll
        seen = {}
        t = threading.Thread(target=lambda: seen.update(other=cdll.tms_get_interesting_region()))
        t.start(); t.join()
        first = cdll.tms_get_interesting_region()
        cdll.tms_set_interesting_region(False)
        from tagmem.compat import torch_memory_saver as dropin
        print(json.dumps([first, seen["other"], cdll.tms_get_interesting_region(),
                          {t: dropin._backups.wants(t) for t in dropin._backups.tags()}]))
        """,
        {"LD_PRELOAD": preload_library(), "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
    )
    assert child == [True, True, False, {"default": True}]


def test_preload_mode_without_the_shim_says_how_to_get_it():
    from tagmem.compat.torch_memory_saver import TorchMemorySaver

    saver = TorchMemorySaver()
    saver.hook_mode = "preload"
    with pytest.raises(RuntimeError, match="configure_subprocess"):
        saver._ensure_initialized()


# ---- vLLM's allocator module ---------------------------------------------------------------------


def test_vllm_install_replaces_the_allocator_module_of_a_vllm_shaped_package():
    child = run_python(
        """
        import json, os, sys
        import tagmem, tagmem.compat.vllm as tv
        tagmem.library_file()  # loads libtagmem
        tv.install(); tv.install()
        from vllm.device_allocator.cumem import CuMemAllocator, find_loaded_library
        import vllm.device_allocator as da
        first = CuMemAllocator.get_instance()
        out = [CuMemAllocator is tv.CuMemAllocator, da.get_mem_allocator_instance() is first,
               CuMemAllocator.default_tag, tv.installed(),
               os.path.realpath(find_loaded_library("libtagmem.so")) == tagmem.library_file(),
               da.cumem is sys.modules["tagmem.compat.vllm"]]
        try:
            tv.SleepBackend().suspend(3)
        except ValueError as e:
            out.append("expected 0, 1 or 2" in str(e))
        print(json.dumps(out))
        """,
        {"PYTHONPATH": f"{STANDINS}:{PACKAGE}"},
    )
    assert child == [True, True, "default", True, True, True, True]


def test_vllm_install_before_vllm_is_imported_and_without_vllm():
    order = run_python(
        """
        import json, tagmem.compat.vllm as tv
        tv.install()
        import vllm.device_allocator as da  # vLLM imported after install: still tagmem's
        print(json.dumps(type(da.get_mem_allocator_instance()).__module__))
        """,
        {"PYTHONPATH": f"{STANDINS}:{PACKAGE}"},
    )
    assert order == "tagmem.compat.vllm"
    alone = run_python(
        """
        import json, tagmem.compat.vllm as tv
        tv.install()
        from vllm.device_allocator.cumem import CuMemAllocator
        print(json.dumps(CuMemAllocator.__module__))
        """,
        {"PYTHONPATH": PACKAGE},
    )
    assert alone == "tagmem.compat.vllm"


def test_vllm_plugin_entry_point_installs_only_when_asked(monkeypatch):
    from tagmem.compat import vllm as tv

    monkeypatch.delitem(sys.modules, tv.MODULE, raising=False)
    monkeypatch.delenv(tv.ENABLE_VARIABLE, raising=False)
    tv.register()
    assert not tv.installed() and not tv.SleepBackend.is_supported()
    monkeypatch.setenv(tv.ENABLE_VARIABLE, "1")
    tv.register()
    assert tv.installed() and tv.SleepBackend.is_supported()


def test_vllm_plugin_registers_the_sleep_backend_vllm_selects_by_name():
    # vLLM's registry refuses a name registered twice, and plugins load more than once per
    # process: register() must be idempotent. Without TAGMEM_AS_VLLM_CUMEM the backend is
    # registered but reports itself unsupported (the weights would not be in tagmem's tags).
    code = """
        import json, types
        import tagmem.compat.vllm as tv
        from vllm.device_allocator import sleep_mode_backend as smb
        out = [tv.register(), tv.register()]
        config = types.SimpleNamespace(sleep_mode_backend="tagmem")
        try:
            backend = smb.SleepModeBackendFactory.create_backend(config)
            out += [type(backend) is tv.SleepBackend, isinstance(backend, smb.SleepModeBackend),
                    backend.state(), backend.preserves_communicators(), tv.installed()]
        except ValueError as e:
            out.append(str(e))
        print(json.dumps(out))
        """
    env = {"PYTHONPATH": f"{STANDINS}:{PACKAGE}"}
    enabled = run_python(code, dict(env, TAGMEM_AS_VLLM_CUMEM="1"))
    assert enabled == [True, True, True, True, "RUNNING", True, True]
    disabled = run_python(code, dict(env, TAGMEM_AS_VLLM_CUMEM=None))
    assert disabled == [True, True, "Sleep-mode backend 'tagmem' is not supported on this platform."]
    without_registry = run_python(
        "import json, tagmem.compat.vllm as tv; print(json.dumps(tv.register()))", {"PYTHONPATH": PACKAGE}
    )
    assert without_registry is False
