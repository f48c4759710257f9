"""Shared fixtures of the tagmem Python tests.

Which files run where (never selected by skipping):
  - test_api.py, test_entry_points.py: no PyTorch. CI runs them on the emulated driver
    (ctest label emu, TAGMEM_LIBCUDA set); gpu_run.sh runs them again on the real driver.
  - test_gpu_*.py: PyTorch on a CUDA GPU; run only by gpu_run.sh. They import torch at module
    level, so running them without PyTorch is a collection error, not a silent pass.
  - fsdp2_two_gpu.py: a torchrun script for two GPUs (gpu_run.sh --two-gpu).

The package is imported from the source tree unless an installed copy is importable already
(gpu_run.sh tests the pip-installed package that way).
"""

import os
import random
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _HERE)  # device_io
try:
    import tagmem  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(_REPO, "integrations", "torch"))
    import tagmem  # noqa: F401

from device_io import DeviceIO  # noqa: E402

REPO_ROOT = _REPO
_SEED = int(os.environ.get("TAGMEM_TEST_SEED", random.SystemRandom().randrange(1 << 32)))


def loaded_libc():
    """The path of the libc this process has mapped: a real library that is not tagmem."""
    with open("/proc/self/maps") as maps:
        return next(line.split()[-1] for line in maps if "/libc.so" in line or "/libc-" in line)


def pytest_report_header(config):
    return f"tagmem: TAGMEM_TEST_SEED={_SEED} library={tagmem.library_origin()}"


@pytest.fixture
def rng(request):
    """A random generator seeded from the run's seed and the test's name (replayable)."""
    return random.Random(f"{_SEED}:{request.node.nodeid}")


@pytest.fixture(scope="session")
def io():
    """Driver copies to and from device memory (see device_io.py)."""
    return DeviceIO(0)


@pytest.fixture(autouse=True)
def fresh_tagmem(request):
    """Each torch-free test starts with no tags: tagmem is shut down after it (it re-initialises
    lazily). Not for test_gpu_* files: PyTorch keeps segments in tagmem across tests there."""
    yield
    if not request.module.__name__.startswith("test_gpu_"):
        tagmem.shutdown()
