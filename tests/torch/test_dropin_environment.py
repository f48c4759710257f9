"""What the torch_memory_saver drop-in does to the environment and the disk: install() and
uninstall() (Note [undoing install()] in tagmem/compat/_tms_env.py), the shell lines of
``python -m tagmem.compat.tms_env``, and nothing written into the package at run time.

Runs on the emulated driver in CI and on the real one in gpu_run.sh (no PyTorch needed).
"""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from tagmem.compat import _tms_env

PACKAGE = os.path.join(REPO_ROOT, "integrations", "torch")


@pytest.fixture
def saved_environment():
    """Puts sys.path, PYTHONPATH and the drop-in's variable back after the test."""
    saved_path = list(sys.path)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", _tms_env.ENABLE_VARIABLE)}
    yield
    _tms_env.uninstall()
    sys.path[:] = saved_path
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def set_or_unset(variable, value):
    if value is None:
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = value


@pytest.mark.parametrize("before", [None, "", "/a::/b", ":", "/only"])
def test_uninstall_gives_back_exactly_the_environment_install_found(saved_environment, before):
    # An empty entry is the current directory to Python: install() must not drop it and
    # uninstall() must not leave the package's directories behind.
    set_or_unset("PYTHONPATH", before)
    os.environ.pop(_tms_env.ENABLE_VARIABLE, None)
    _tms_env.install()
    _tms_env.install()
    assert os.environ["PYTHONPATH"].split(":")[0] == _tms_env.shim_path()
    assert sys.path[0] == _tms_env.shim_path()
    _tms_env.uninstall()
    assert os.environ.get("PYTHONPATH") == before
    assert _tms_env.ENABLE_VARIABLE not in os.environ
    assert _tms_env.shim_path() not in sys.path
    _tms_env.uninstall()  # a second uninstall changes nothing
    assert os.environ.get("PYTHONPATH") == before


def test_uninstall_keeps_what_was_changed_since_install(saved_environment):
    os.environ["PYTHONPATH"] = "/mine"
    os.environ[_tms_env.ENABLE_VARIABLE] = "0"
    _tms_env.install()
    os.environ["PYTHONPATH"] += ":/added-later"
    _tms_env.uninstall()
    assert os.environ["PYTHONPATH"] == "/mine:/added-later"
    assert os.environ[_tms_env.ENABLE_VARIABLE] == "0"


def test_install_puts_no_site_packages_on_pythonpath(saved_environment, monkeypatch):
    # A package installed in this interpreter's site-packages is found by its children anyway;
    # that directory on PYTHONPATH would come first for every other interpreter too.
    import site

    parent = os.path.dirname(os.path.dirname(os.path.dirname(_tms_env.__file__)))
    monkeypatch.setattr(site, "getsitepackages", lambda: [parent])
    os.environ.pop("PYTHONPATH", None)
    _tms_env.install()
    assert os.environ["PYTHONPATH"] == _tms_env.shim_path()


def copy_package(destination):
    shutil.copytree(os.path.join(PACKAGE, "tagmem"), os.path.join(destination, "tagmem"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return destination


def test_tms_env_lines_are_safe_to_eval_whatever_the_install_path(tmp_path):
    hostile = tmp_path / "a b'$(touch pwned)`touch pwned2`\"$HOME"
    copy_package(hostile)
    lines = subprocess.run(
        [sys.executable, "-m", "tagmem.compat.tms_env"], env=dict(os.environ, PYTHONPATH=str(hostile)),
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout
    shell = subprocess.run(
        ["bash", "-c", 'eval "$1"; printf "%s" "$PYTHONPATH"', "bash", lines],
        env=dict(os.environ, PYTHONPATH="/rest"), cwd=tmp_path, capture_output=True, text=True,
        check=True,
    )
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    expected = os.path.join(hostile, "tagmem", "compat", "tms_path")
    assert shell.stdout == f"{expected}:/rest"


def test_install_writes_nothing_into_the_package(tmp_path):
    # A link made at run time inside the package is never re-pointed: once dangling it can
    # name a file anyone can create, which callers then put on LD_PRELOAD.
    package = copy_package(tmp_path / "site")

    def listing():
        return sorted(
            (os.path.relpath(os.path.join(root, n), package), os.path.islink(os.path.join(root, n)))
            for root, dirs, names in os.walk(package) for n in names + dirs
            if "__pycache__" not in root and n != "__pycache__"
        )

    before = listing()
    code = "import tagmem.compat.torch_memory_saver as t; t.install()"
    env = dict(os.environ, PYTHONPATH=str(package), PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    assert listing() == before
