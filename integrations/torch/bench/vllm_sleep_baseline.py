"""A vLLM sleep-mode baseline for the RL cycle, built at run time from a vLLM source checkout.

vLLM does not need to be installed: this file holds none of vLLM's code. Given the path of a vLLM
source tree (--vllm-src), it

- compiles that tree's ``csrc/cumem_allocator.cpp`` (the C extension behind vLLM's sleep mode:
  the ``my_malloc``/``my_free`` hooks PyTorch calls through ``CUDAPluggableAllocator``,
  ``python_create_and_map`` and ``python_unmap_and_release``) with
  ``torch.utils.cpp_extension.load``, linked with ``-lcuda``, as the module
  ``vllm.cumem_allocator``;
- imports that tree's ``vllm/device_allocator/cumem.py`` (``CuMemAllocator``: ``use_memory_pool``,
  ``sleep``, ``wake_up``) and every vLLM module it imports that exists as a file in the tree (the
  ``device_allocator`` package that defines ``AllocationData``, ``cuda_wrapper.py``'s
  ``CudaRTLibrary`` that does the copies) as vLLM's own code.

The allocator and the sleep and wake-up logic are vLLM's own. The stand-ins, put in
``sys.modules``, are logging and configuration trivia only: ``vllm.logger.init_logger`` (the
standard ``logging.getLogger``), ``vllm.envs`` (every setting unset), ``vllm.platforms``
(``current_platform`` says CUDA, not ROCm), ``is_pin_memory_available`` (True, as on any Linux
CUDA host), ``find_loaded_library`` (the path of a shared library loaded in this process, from
``/proc/self/maps``), and empty parent packages (``vllm``, ``vllm.utils``, ...) whose
``__init__.py`` would otherwise import the whole engine. The list of what came from the tree
and what was a stand-in is printed when the allocator loads.

vLLM's mapping of the RL cycle (``sleep(level=1)`` of a vLLM worker): the weights and optimizer
regions are allocated under the tag ``"weights"``, the kv cache under ``"kv_cache"``;

- pause = ``sleep(offload_tags=("weights",))``: every "weights" allocation is copied to a new
  pinned CPU tensor and released, the kv cache is released without a copy (vLLM has no separate
  kv pause: this one step is both of the cycle's pauses);
- resume = ``wake_up(tags=["weights"])``, then ``wake_up(tags=["kv_cache"])``.

Only the allocator is timed, not a vLLM worker's other work around ``sleep``/``wake_up``.

Files of vLLM it needs (the rest of the tree may be absent): ``--list-files`` prints them.

    python3 integrations/torch/bench/phase_switch.py --scenario rl_cycle \\
        --methods tagmem,vllm_sleep --vllm-src .probe/vllm
    python3 integrations/torch/bench/vllm_sleep_baseline.py --vllm-src .probe/vllm --list-files
"""

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import sys
import types

# The files of vLLM this baseline reads, relative to the checkout; the optional ones exist only
# in some vLLM versions.
NEEDED_FILES = (
    "csrc/cumem_allocator.cpp",
    "vllm/device_allocator/cumem.py",
    "vllm/distributed/device_communicators/cuda_wrapper.py",
)
OPTIONAL_FILES = (
    "csrc/cumem_allocator_compat.h",  # included by the .cpp in trees that have it
    "vllm/device_allocator/__init__.py",  # defines AllocationData in trees where cumem.py does not
)

# vLLM packages whose own __init__.py is run (they define what cumem.py imports). Every other
# vLLM package is an empty stand-in whose submodules are looked up in the checkout.
REAL_PACKAGE_SUFFIX = "device_allocator"

WEIGHTS_TAG, KV_TAG = "weights", "kv_cache"
TAG_OF_REGION = {"rl_weights": WEIGHTS_TAG, "rl_optim": WEIGHTS_TAG, "rl_kv": KV_TAG}


def list_files(src):
    """(path, present) for every vLLM file this baseline may read."""
    return [(p, os.path.isfile(os.path.join(src, p))) for p in NEEDED_FILES + OPTIONAL_FILES]


def check_files(src):
    missing = [p for p in NEEDED_FILES if not os.path.isfile(os.path.join(src, p))]
    if missing:
        raise SystemExit(f"--vllm-src {src}: missing {', '.join(missing)} (see --list-files)")


def find_loaded_library(lib_name):
    """The path of the shared library whose file name starts with `lib_name` in this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if os.path.basename(path).startswith(lib_name):
                return path
    return None


class _Platform:
    """vllm.platforms.current_platform, reduced to the questions the allocator's code asks."""

    device_type = "cuda"

    def is_rocm(self):
        return False

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_xpu(self):
        return False


def _unset_setting(name):
    if name.startswith("VLLM_"):
        return None  # every vLLM setting unset: its code falls back to its defaults
    raise AttributeError(name)


def install_standins(src, extension):
    """Puts the stand-ins in sys.modules; returns their names. Each is logging or configuration."""
    helpers = {
        "init_logger": logging.getLogger,
        "is_pin_memory_available": lambda: True,
        "find_loaded_library": find_loaded_library,
    }
    contents = {
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.envs": {"__getattr__": _unset_setting},
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.utils": helpers,  # older trees import both helpers from vllm.utils
        "vllm.utils.platform_utils": helpers,
        "vllm.utils.system_utils": helpers,
    }
    for name, attrs in contents.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        module.__path__ = [os.path.join(src, *name.split("."))]  # submodules resolve in the tree
        sys.modules[name] = module
    sys.modules["vllm.cumem_allocator"] = extension
    return list(contents)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vllm.* imports not in sys.modules: the checkout's file, else an empty package."""

    def __init__(self, src):
        self.src = src
        self.real, self.empty = [], []

    def find_spec(self, name, path=None, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        base = os.path.join(self.src, *name.split("."))
        if os.path.isfile(base + ".py"):
            self.real.append(os.path.relpath(base + ".py", self.src))
            return importlib.util.spec_from_file_location(name, base + ".py")
        init = os.path.join(base, "__init__.py")
        if name.endswith(REAL_PACKAGE_SUFFIX) and os.path.isfile(init):
            self.real.append(os.path.relpath(init, self.src))
            return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[base])
        if os.path.isdir(base):
            self.empty.append(name)
            spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
            spec.submodule_search_locations = [base]
            return spec
        return None  # ModuleNotFoundError: neither in the checkout nor a stand-in

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass  # an empty package: its __init__.py would import the whole engine


def _cuda_stub_dirs():
    from torch.utils.cpp_extension import CUDA_HOME

    home = CUDA_HOME or "/usr/local/cuda"
    cands = (os.path.join(home, "lib64", "stubs"), os.path.join(home, "targets", "x86_64-linux", "lib", "stubs"))
    return [d for d in cands if os.path.isfile(os.path.join(d, "libcuda.so"))]


def build_extension(src, build_dir):
    """Compiles the checkout's csrc/cumem_allocator.cpp as the Python module cumem_allocator."""
    from torch.utils import cpp_extension

    os.makedirs(build_dir, exist_ok=True)
    ldflags = [f"-L{d}" for d in _cuda_stub_dirs()] + ["-lcuda"]
    return cpp_extension.load(
        name="cumem_allocator",  # the extension's PyInit_ function fixes this name
        sources=[os.path.join(src, "csrc", "cumem_allocator.cpp")],
        extra_include_paths=[os.path.join(src, "csrc")],
        extra_ldflags=ldflags,
        with_cuda=True,
        build_directory=build_dir,
        verbose=False,
    )


def load_cumem(src, build_dir):
    """vLLM's vllm.device_allocator.cumem module, from the checkout at `src`."""
    import importlib

    src = os.path.abspath(src)
    check_files(src)
    extension = build_extension(src, build_dir)
    standins = install_standins(src, extension)
    finder = _Finder(src)
    sys.meta_path.insert(0, finder)
    try:
        # Imported first so that an error in it is raised here: cumem.py turns it into
        # cumem_available = False.
        importlib.import_module("vllm.distributed.device_communicators.cuda_wrapper")
        cumem = importlib.import_module("vllm.device_allocator.cumem")
    finally:
        sys.meta_path.remove(finder)
    if not getattr(cumem, "cumem_available", True):
        raise SystemExit("vLLM's cumem.py says cumem_available = False: one of its imports failed")
    if "tags" not in inspect.signature(cumem.CuMemAllocator.wake_up).parameters:
        raise SystemExit("this vLLM tree's CuMemAllocator.wake_up takes no tags: use a newer one")
    print("[vllm_sleep] vLLM's code: csrc/cumem_allocator.cpp (built here), " + ", ".join(finder.real), flush=True)
    print("[vllm_sleep] stand-ins: " + ", ".join(standins) + "; empty packages: " + ", ".join(finder.empty),
          flush=True)
    return cumem


class VllmSleepSaver:
    """The RL cycle's saver interface (region, cycle steps) over vLLM's CuMemAllocator."""

    def __init__(self, src, build_dir):
        self.cumem = load_cumem(src, build_dir)
        self.allocator = self.cumem.CuMemAllocator.get_instance()
        # use_memory_pool keeps one pool per tag; two regions share the tag "weights", so the
        # first one's pool is held here too (a pool must outlive its tensors).
        self._pools = []

    @contextlib.contextmanager
    def region(self, name, enable_cpu_backup):
        tag = TAG_OF_REGION[name]
        if enable_cpu_backup != (tag == WEIGHTS_TAG):
            raise ValueError(f"region {name}: vLLM backs up the tag {WEIGHTS_TAG!r} only")
        with self.allocator.use_memory_pool(tag=tag):
            yield
        self._pools.append(getattr(self.allocator, "allocator_and_pools", {}).get(tag))

    def cycle_steps(self):
        """(result key, step) in vLLM's order: one sleep pauses both; weights wake first."""
        return [
            ("pause_weights_s", lambda: self.allocator.sleep(offload_tags=(WEIGHTS_TAG,))),
            ("resume_weights_s", lambda: self.allocator.wake_up(tags=[WEIGHTS_TAG])),
            ("resume_kv_s", lambda: self.allocator.wake_up(tags=[KV_TAG])),
        ]


def default_build_dir():
    import tempfile

    return os.path.join(tempfile.gettempdir(), "tagmem_vllm_cumem_build")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Other arguments go to rl_cycle.py (--layers, --scale, --kv-gib, --cycles, ...).",
    )
    ap.add_argument("--vllm-src", required=True, help="a vLLM source checkout (see --list-files)")
    ap.add_argument("--list-files", action="store_true", help="list the vLLM files used and exit")
    args, rest = ap.parse_known_args(argv)
    if args.list_files:
        for path, present in list_files(args.vllm_src):
            need = "needed" if path in NEEDED_FILES else "if the version has it"
            print(f"{'present' if present else 'MISSING'}  {path}  ({need})")
        return 0 if all(p for f, p in list_files(args.vllm_src) if f in NEEDED_FILES) else 1
    check_files(args.vllm_src)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rl_cycle

    return rl_cycle.main(["--method", "vllm_sleep", "--vllm-src", args.vllm_src] + rest)


if __name__ == "__main__":
    sys.exit(main())
