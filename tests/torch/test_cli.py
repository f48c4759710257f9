"""``python -m tagmem`` (tagmem/__main__.py), run as a user would, in subprocesses: preload-path,
config, stats and run. No PyTorch. Runs where test_api.py runs (ctest torch_python_emu on the
emulated driver, TAGMEM_PRELOAD_LIBRARY set to the build's shim).
"""

import ctypes.util
import os
import re
import signal
import subprocess
import sys

from conftest import REPO_ROOT
from tagmem import _api


def tagmem_cli(*args, env=None, drop=()):
    environment = dict(os.environ if env is None else env)
    for name in drop:
        environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "tagmem", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def shim():
    path = os.environ.get("TAGMEM_PRELOAD_LIBRARY")
    assert path and os.path.exists(path), "the test needs TAGMEM_PRELOAD_LIBRARY (set by ctest)"
    return path


def test_preload_path_prints_the_shim():
    out = tagmem_cli("preload-path")
    assert out.returncode == 0, out.stderr
    assert out.stdout == shim() + "\n"


def test_preload_path_fails_with_a_message_when_the_shim_is_missing(tmp_path):
    env = dict(os.environ, TAGMEM_PRELOAD_LIBRARY=str(tmp_path / "absent.so"))
    out = tagmem_cli("preload-path", env=env)
    assert out.returncode == 1
    assert out.stdout == ""
    assert "libtagmem_preload.so not found" in out.stderr and "TAGMEM_PRELOAD_LIBRARY" in out.stderr


def test_help_opens_with_the_whole_summary_sentence():
    out = tagmem_cli("--help")
    assert out.returncode == 0, out.stderr
    # argparse prints the description after the usage lines, wrapped to the terminal's width.
    text = " ".join(out.stdout.split("\n\n")[1].split())
    assert text == (
        "python -m tagmem: where the installed libraries are, the settings in effect, "
        "statistics, and running a program under the LD_PRELOAD shim."
    ), out.stdout


def test_run_starts_the_command_with_the_shim_first_on_ld_preload(rng):
    libm = ctypes.util.find_library("m")
    assert libm
    token = "".join(rng.choice("abc xyz-'\"$") for _ in range(24))
    code = rng.randrange(3, 100)
    probe = (
        "import ctypes, os, sys; "
        "print(os.environ['LD_PRELOAD']); "
        "print(hasattr(ctypes.CDLL(None), 'tagmem_preload_set_thread_routing')); "
        "print(sys.argv[1]); "
        f"sys.exit({code})"
    )
    env = dict(os.environ, LD_PRELOAD=libm)
    out = tagmem_cli("run", "--", sys.executable, "-c", probe, token, env=env)
    assert out.returncode == code, out.stderr
    assert out.stdout.split("\n")[:3] == [f"{shim()}:{libm}", "True", token]


def test_run_without_a_command_fails():
    out = tagmem_cli("run", "--")
    assert out.returncode == 1
    assert "no command given" in out.stderr


def test_run_reports_a_command_that_cannot_start(tmp_path):
    out = tagmem_cli("run", "--", str(tmp_path / "no-such-program"))
    assert out.returncode == 1
    assert "cannot start" in out.stderr


def setting(text, name):
    """(origin, value) of `name` in the settings part of ``python -m tagmem config``."""
    lines = [line.split(None, 2) for line in text.splitlines() if line.split()[:1] == [name]]
    assert len(lines) == 1, text
    return tuple(lines[0][1:] + [""] * (3 - len(lines[0])))


def test_config_prints_what_the_library_describes(rng):
    streams = str(rng.randrange(1, 17))
    unknown = f"TAGMEM_NOT_A_SETTING_{rng.randrange(1 << 30)}"
    device_bytes = f"{rng.randrange(1, 64)}.5GiB"
    env = dict(os.environ, TAGMEM_COPY_STREAMS=streams, TAGMEM_HOST_PIN="mlock", **{unknown: "7"})
    env["TAGMEM_EMU_DEVICE_BYTES"] = device_bytes
    env.pop("TAGMEM_CHUNK_BYTES", None)
    out = tagmem_cli("config", env=env)
    assert out.returncode == 0, out.stderr
    assert setting(out.stdout, "TAGMEM_COPY_STREAMS") == ("environment", streams)
    assert setting(out.stdout, "TAGMEM_EMU_DEVICE_BYTES") == ("environment", device_bytes)
    assert setting(out.stdout, "TAGMEM_CHUNK_BYTES") == ("default", "2 MiB")
    assert setting(out.stdout, "TAGMEM_HOST_PIN") == ("invalid", "mlock")
    assert setting(out.stdout, unknown) == ("unknown", "7")
    # The package's own variables are in the library's table too.
    assert setting(out.stdout, "TAGMEM_LIBRARY") == ("environment", os.environ["TAGMEM_LIBRARY"])
    libraries = dict(line.split(None, 1) for line in out.stdout.splitlines()[1:5])
    assert libraries["libtagmem_preload"] == shim()
    assert libraries["libtagmem"] == os.path.realpath(os.environ["TAGMEM_LIBRARY"])


def test_config_tells_the_rendezvous_directory_tagmem_picked_from_one_the_user_gave(tmp_path):
    # Without TAGMEM_PEER_DIR, TAGMEM_NCCL_DIR or XDG_RUNTIME_DIR, the library picks a directory
    # when it loads and sets TAGMEM_NCCL_DIR for the processes it starts: not the user's setting.
    drop = ("TAGMEM_PEER_DIR", "TAGMEM_NCCL_DIR", "XDG_RUNTIME_DIR")
    out = tagmem_cli("config", drop=drop)
    assert out.returncode == 0, out.stderr
    origin, value = setting(out.stdout, "TAGMEM_NCCL_DIR")
    assert origin == "chosen-by-tagmem" and "/tagmem-" in value, out.stdout
    given = str(tmp_path / "peers")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    out = tagmem_cli("config", env=dict(env, TAGMEM_NCCL_DIR=given))
    assert setting(out.stdout, "TAGMEM_NCCL_DIR") == ("environment", given)


def _sources(top, suffixes):
    for directory, _, files in os.walk(os.path.join(REPO_ROOT, top)):
        for name in files:
            if name.endswith(suffixes) and name != "setup.py":
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    yield os.path.join(directory, name), f.read()


def test_every_variable_read_is_in_the_library_table():
    """C and C++ sources read TAGMEM_* settings only through the table (no getenv of a literal
    name), and every "TAGMEM_*" literal of the Python package is a setting of that table."""
    table = {line.split()[0] for line in _api.config_describe().splitlines()}
    table = {n for n in table if not n.startswith("TAGMEM_NOT_A_SETTING_")}
    for top in ("allocator", "integrations"):
        for path, text in _sources(top, (".cpp", ".c", ".hpp")):
            assert not re.search(r"getenv\(\s*\"TAGMEM_", text), f"{path} reads a setting past the table"
    for path, text in _sources("integrations/torch/tagmem", (".py",)):
        used = set(re.findall(r"\"(TAGMEM_[A-Z0-9_]+)\"", text))
        assert used <= table, f"{path}: {used - table} not in allocator/options/options.def"


def test_the_emulated_driver_reads_sizes_as_the_library_does(rng):
    half = rng.randrange(1, 64)
    env = dict(os.environ, TAGMEM_EMU_DEVICE_BYTES=f"{half}.5GiB")
    assert stats_lines(tagmem_cli("stats", env=env))["device_total_bytes"][0] == str((2 * half + 1) << 29)
    env["TAGMEM_EMU_DEVICE_BYTES"] = f"{half}GB"
    assert stats_lines(tagmem_cli("stats", env=env))["device_total_bytes"][0] == str(half * 10**9)
    env["TAGMEM_EMU_DEVICE_BYTES"] = f"{half}.3X"
    out = tagmem_cli("stats", env=env)
    assert out.returncode == 1
    assert f"TAGMEM_EMU_DEVICE_BYTES='{half}.3X' is not a size" in out.stderr


def stats_lines(out):
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.strip()}


def test_stats_reports_the_device_and_the_metadata_heap(rng):
    device_bytes = rng.randrange(1, 64) << 30
    env = dict(os.environ, TAGMEM_EMU_DEVICE_BYTES=str(device_bytes))
    env.pop("TAGMEM_METADATA", None)
    env.pop("TAGMEM_MIMALLOC_LIBRARY", None)
    lines = stats_lines(tagmem_cli("stats", env=env))
    assert lines["device_total_bytes"][0] == str(device_bytes)
    # Its own new process: no tags, and it says so rather than claiming to show a program's.
    assert lines["tags:"] == ["0", "(of", "this", "process)"]
    assert lines["process"][1:3] == ["(this", "command's"]
    try:
        ctypes.CDLL("libmimalloc.so.2", mode=os.RTLD_LOCAL)
        expected = "mimalloc"
    except OSError:
        expected = "system"
    assert lines["metadata"] == ["heap", expected]


def test_stats_says_when_the_metadata_heap_falls_back_to_malloc(tmp_path):
    for variable, value in (
        ("TAGMEM_MIMALLOC_LIBRARY", str(tmp_path / "libmimalloc-absent.so")),
        ("TAGMEM_METADATA", "system"),
    ):
        env = dict(os.environ, **{variable: value})
        assert stats_lines(tagmem_cli("stats", env=env))["metadata"] == ["heap", "system"]


def test_stats_without_a_driver_fails_with_the_reason(tmp_path):
    env = dict(os.environ, TAGMEM_LIBCUDA=str(tmp_path / "libcuda-absent.so"))
    out = tagmem_cli("stats", env=env)
    assert out.returncode == 1
    assert out.stdout == ""
    assert "cannot load the CUDA driver" in out.stderr


def test_every_command_ends_quietly_when_its_reader_has_gone():
    # `python -m tagmem stats | head -1`: the reader is gone before the command writes. Without
    # the default SIGPIPE action Python raises BrokenPipeError and prints a traceback.
    for command in (["stats"], ["config"], ["preload-path"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            out = subprocess.run([sys.executable, "-m", "tagmem", *command], stdout=write_end,
                                 stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write_end)
        assert out.returncode == -signal.SIGPIPE, (command, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr


def test_run_starts_its_command_with_the_default_sigpipe_action():
    # Python ignores SIGPIPE, and an ignored signal stays ignored across exec: the command would
    # then not end when its reader goes away. cat is the command itself (run execs it).
    out = tagmem_cli("run", "--", "cat", "/proc/self/status")
    assert out.returncode == 0, out.stderr
    ignored = next(line for line in out.stdout.splitlines() if line.startswith("SigIgn:"))
    assert not int(ignored.split()[1], 16) & (1 << (signal.SIGPIPE - 1)), ignored
