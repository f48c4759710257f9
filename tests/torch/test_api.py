"""The torch-free Python API (tagmem.*): scopes, offload/reload/swap/resident, errors, stats.

Runs on the emulated driver in CI and on the real driver in gpu_run.sh (see conftest.py). Device
bytes are written and read back through driver copies (device_io.py) and compared byte for byte.
"""

import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import tagmem
from conftest import REPO_ROOT

MiB = 1 << 20
# On a GPU the driver's own small allocations move free memory by up to 2 MiB (none on the emulator).
NOISE = 0 if os.environ.get("TAGMEM_LIBCUDA") else 2 * MiB


def fill(io, rng, address, nbytes):
    data = rng.randbytes(nbytes)
    io.write(address, data)
    return data


# ---- tag scopes -------------------------------------------------------------------------------


def test_tag_scope_routes_allocations_and_nests():
    assert tagmem.current_tag() == "default"
    with tagmem.tag("outer"):
        a = tagmem.raw_alloc(1000)
        with tagmem.tag("inner"):
            assert tagmem.current_tag() == "inner"
            b = tagmem.raw_alloc(1000)
        c = tagmem.raw_alloc(1000)
    d = tagmem.raw_alloc(1000)
    assert [tagmem.pointer_info(p)["tag"] for p in (a, b, c, d)] == ["outer", "inner", "outer", "default"]
    assert sorted(tagmem.tags()) == ["default", "inner", "outer"]


def test_tag_scope_is_per_thread_and_pops_after_an_exception():
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def other():
        inside.wait()
        seen["other"] = tagmem.current_tag()
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with pytest.raises(KeyError):
        with tagmem.tag("mine"):
            inside.set()
            release.wait()
            seen["mine"] = tagmem.current_tag()
            raise KeyError("boom")
    t.join()
    assert seen == {"other": "default", "mine": "mine"}
    assert tagmem.current_tag() == "default"


# ---- offload and reload -----------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[1000, 3 * MiB + 17, 17 * MiB], [256] * 40])
def test_backup_offload_reload_restores_every_byte_at_the_same_address(io, rng, sizes):
    pointers = [tagmem.raw_alloc(n, tag="w") for n in sizes]
    data = [fill(io, rng, p, n) for p, n in zip(pointers, sizes)]
    before = tagmem.stats("w")
    free_before = io.free_bytes()

    tagmem.offload("w")
    during = tagmem.stats("w")
    assert during["state"] == "offloaded_backup"
    assert during["mapped_bytes"] == 0
    assert during["host_bytes"] >= before["allocated_bytes"]
    assert io.free_bytes() >= free_before + before["mapped_bytes"] - NOISE

    tagmem.reload("w")
    assert tagmem.state("w") == "resident"
    for p, n, d in zip(pointers, sizes, data):
        assert tagmem.pointer_info(p) == {"tag": "w", "device": 0, "base": p, "size": n}
        assert io.read(p, n) == d
    after = tagmem.stats("w")
    assert after["offload_count"] == 1 and after["reload_count"] == 1
    assert after["bytes_offloaded"] >= sum(sizes)


def test_discard_releases_memory_and_reload_gives_writable_memory(io, rng):
    p = tagmem.raw_alloc(5 * MiB, tag="kv")
    fill(io, rng, p, 5 * MiB)
    free_before = io.free_bytes()
    tagmem.offload(["kv"], mode="discard")
    assert tagmem.state("kv") == "offloaded_discard"
    assert tagmem.stats("kv")["host_bytes"] == 0
    tagmem.wait_released()  # DISCARD releases in the background
    assert tagmem.stats()["release_pending_bytes"] == 0
    assert io.free_bytes() >= free_before + 5 * MiB - NOISE
    tagmem.reload("kv")
    fresh = fill(io, rng, p, 5 * MiB)
    assert io.read(p, 5 * MiB) == fresh


def test_swap_exchanges_phases_and_keeps_both_tags_bytes(io, rng):
    a = tagmem.raw_alloc(3 * MiB, tag="trainer")
    b = tagmem.raw_alloc(2 * MiB, tag="rollout")
    da = fill(io, rng, a, 3 * MiB)
    db = fill(io, rng, b, 2 * MiB)
    tagmem.offload("rollout")
    tagmem.swap("trainer", "rollout")
    assert (tagmem.state("trainer"), tagmem.state("rollout")) == ("offloaded_backup", "resident")
    assert io.read(b, 2 * MiB) == db
    tagmem.swap(["rollout"], ["trainer"], mode=tagmem.BACKUP)
    assert io.read(a, 3 * MiB) == da
    with pytest.raises(tagmem.InvalidArgumentError, match="both lists"):
        tagmem.swap("trainer", "trainer")


def test_resident_reloads_on_entry_and_offloads_on_exit_even_after_an_exception(io, rng):
    w = tagmem.raw_alloc(MiB, tag="weights")
    data = fill(io, rng, w, MiB)
    tagmem.offload("weights")
    with pytest.raises(ValueError):
        with tagmem.resident("weights", "kv_cache"):  # kv_cache does not exist yet
            assert tagmem.state("weights") == "resident"
            assert io.read(w, MiB) == data
            kv = tagmem.raw_alloc(MiB, tag="kv_cache")
            fill(io, rng, kv, MiB)
            raise ValueError("phase failed")
    assert tagmem.state("weights") == "offloaded_backup"
    assert tagmem.state("kv_cache") == "offloaded_backup"
    with tagmem.resident("weights", mode="discard"):
        assert io.read(w, MiB) == data
    assert tagmem.state("weights") == "offloaded_discard"


def test_resident_offloads_each_tag_in_the_mode_it_was_offloaded_in_or_the_one_given(io, rng):
    w = tagmem.raw_alloc(MiB, tag="weights")
    kv = tagmem.raw_alloc(2 * MiB, tag="kv_cache")
    data = fill(io, rng, w, MiB)
    fill(io, rng, kv, 2 * MiB)
    tagmem.offload("weights", tagmem.BACKUP)
    tagmem.offload("kv_cache", tagmem.DISCARD)
    for _ in range(2):  # a DISCARD tag stays DISCARD phase after phase, without a backup
        with tagmem.resident("weights", "kv_cache"):
            assert io.read(w, MiB) == data
            fill(io, rng, kv, 2 * MiB)
        assert tagmem.state("weights") == "offloaded_backup"
        assert tagmem.state("kv_cache") == "offloaded_discard"
        assert tagmem.stats("kv_cache")["host_bytes"] == 0
    with tagmem.resident("weights", "kv_cache", mode={"kv_cache": "backup"}):
        kv_data = fill(io, rng, kv, 2 * MiB)
    assert tagmem.state("weights") == "offloaded_backup"  # not in the dict: BACKUP
    assert tagmem.state("kv_cache") == "offloaded_backup"
    with tagmem.resident("kv_cache", mode="discard"):
        assert io.read(kv, 2 * MiB) == kv_data
    assert tagmem.state("kv_cache") == "offloaded_discard"
    with pytest.raises(tagmem.InvalidArgumentError, match="not among the listed tags"):
        with tagmem.resident("weights", mode={"kv_cache": "discard"}):
            pass
    assert tagmem.state("weights") == "offloaded_backup"  # nothing was reloaded


def test_reload_out_of_memory_keeps_the_backup_and_succeeds_once_memory_is_freed(io, rng):
    p = tagmem.raw_alloc(64 * MiB, tag="big")
    data = fill(io, rng, p, 64 * MiB)
    tagmem.offload("big")
    hog_bytes = (io.free_bytes() - 32 * MiB) // (2 * MiB) * (2 * MiB)
    hog = tagmem.raw_alloc(hog_bytes, tag="hog")
    with pytest.raises(tagmem.OutOfMemoryError) as caught:
        tagmem.reload("big")
    assert isinstance(caught.value, MemoryError)
    assert caught.value.status_name == "TAGMEM_ERROR_OUT_OF_MEMORY" and "memory" in str(caught.value)
    assert tagmem.state("big") == "offloaded_backup"
    assert tagmem.stats("big")["host_bytes"] >= 64 * MiB
    tagmem.raw_free(hog)
    tagmem.empty_cache()
    tagmem.reload("big")
    assert io.read(p, 64 * MiB) == data


# ---- errors -------------------------------------------------------------------------------------


def test_errors_are_exceptions_with_tagmem_status_and_message():
    p = tagmem.raw_alloc(4096, tag="e")
    tagmem.offload("e")
    cases = [
        (lambda: tagmem.offload("nope"), tagmem.UnknownTagError, "TAGMEM_ERROR_UNKNOWN_TAG", "nope"),
        (lambda: tagmem.offload("e"), tagmem.TagOffloadedError, "TAGMEM_ERROR_TAG_OFFLOADED", "'e'"),
        (lambda: tagmem.raw_alloc(10, tag="e"), tagmem.TagOffloadedError, "TAGMEM_ERROR_TAG_OFFLOADED", "offloaded"),
        (lambda: tagmem.raw_free(p + 16), tagmem.UnknownPointerError, "TAGMEM_ERROR_UNKNOWN_POINTER", "not a live allocation"),
        (lambda: tagmem.raw_alloc(10, tag="x" * 64), tagmem.InvalidArgumentError, "TAGMEM_ERROR_INVALID_ARGUMENT", "longer"),
        (lambda: tagmem.raw_alloc(0, tag="z"), tagmem.InvalidArgumentError, "TAGMEM_ERROR_INVALID_ARGUMENT", ""),
        (lambda: tagmem.offload("e", mode="sideways"), tagmem.InvalidArgumentError, "TAGMEM_ERROR_INVALID_ARGUMENT", "sideways"),
        (lambda: tagmem.offload(["a", 3]), tagmem.InvalidArgumentError, "TAGMEM_ERROR_INVALID_ARGUMENT", "str"),
        (lambda: tagmem.stats("nope"), tagmem.UnknownTagError, "TAGMEM_ERROR_UNKNOWN_TAG", "nope"),
        (lambda: tagmem.pointer_info(12345), tagmem.UnknownPointerError, "TAGMEM_ERROR_UNKNOWN_POINTER", "not allocated"),
    ]
    for call, cls, status, text in cases:
        with pytest.raises(cls) as caught:
            call()
        e = caught.value
        assert isinstance(e, tagmem.TagmemError)
        assert e.status_name == status and str(e).startswith(status + ": ")
        assert text in str(e) and len(str(e)) > len(status) + 2
    tagmem.reload("e")
    with pytest.raises(tagmem.TagResidentError, match="resident"):
        tagmem.reload("e")
    with pytest.raises(tagmem.InvalidArgumentError, match="already initialised"):
        tagmem.init()


def test_arguments_ctypes_would_convert_are_refused_before_the_call():
    """ctypes turns -1 into SIZE_MAX, 2**32 + 1 into device 1 and "a\\0b" into tag "a"."""
    keep = tagmem.raw_alloc(4096, tag="kept")
    cases = [
        (lambda: tagmem.host_reserve(-1, wait=True), "out of range"),
        (lambda: tagmem.host_reserve(-1), "out of range"),
        (lambda: tagmem.host_reserve(1 << 64), "out of range"),
        (lambda: tagmem.host_trim(-1), "out of range"),
        (lambda: tagmem.raw_alloc(-1, tag="neg"), "out of range"),
        (lambda: tagmem.raw_alloc((1 << 64) + 4096, tag="wrap"), "out of range"),
        (lambda: tagmem.raw_alloc(4096.5, tag="float"), "integer"),
        (lambda: tagmem.raw_alloc(True, tag="bool"), "bool"),
        (lambda: tagmem.raw_alloc(4096, tag="dev", device=(1 << 32)), "device"),
        (lambda: tagmem.raw_alloc(4096, tag="dev", device=-2), "device"),
        (lambda: tagmem.raw_alloc(4096, tag="dev", device=1.0), "device"),
        (lambda: tagmem.raw_alloc(4096, tag="strm", stream=-1), "stream"),
        (lambda: tagmem.raw_alloc(4096, tag="a\0b"), "NUL"),
        (lambda: tagmem.tag("a\0b").__enter__(), "NUL"),
        (lambda: tagmem.offload("kept\0"), "NUL"),
        (lambda: tagmem.stats("kept\0junk"), "NUL"),
        (lambda: tagmem.offload("kept", device=(1 << 32)), "device"),
        (lambda: tagmem.tags(device=(1 << 32) + 1), "device"),
        (lambda: tagmem.raw_free(-keep), "ptr"),
        (lambda: tagmem.raw_free(keep + (1 << 64)), "ptr"),
        (lambda: tagmem.pointer_info(keep - (1 << 64)), "ptr"),
        (lambda: tagmem.init(chunk_bytes=-1), "chunk_bytes"),
    ]
    for i, (call, text) in enumerate(cases):
        with pytest.raises(tagmem.InvalidArgumentError, match=text) as caught:
            call()
        assert caught.value.status_name == "TAGMEM_ERROR_INVALID_ARGUMENT", i
    # None of them reached tagmem: no tag was made, nothing pinned, the allocation is intact.
    assert tagmem.tags() == ["kept"] and tagmem.current_tag() == "default"
    assert tagmem.stats()["host_pinned_bytes"] == 0
    assert tagmem.stats("kept")["live_allocations"] == 1
    tagmem.raw_free(keep)


def test_a_negative_background_reserve_leaves_offloads_working(rng):
    # Before arguments were checked, -1 reached the C library as SIZE_MAX and the offload then
    # waited forever for background pinning; a child process with a deadline turns a hang into
    # a failure.
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from device_io import DeviceIO\n"
        "import tagmem, random\n"
        "try:\n"
        "    tagmem.host_reserve(-1)\n"
        "except tagmem.InvalidArgumentError as e:\n"
        "    print('refused', e)\n"
        "io = DeviceIO(0)\n"
        "p = tagmem.raw_alloc(3 << 20, tag='spill')\n"
        "data = random.Random(%r).randbytes(3 << 20)\n"
        "io.write(p, data)\n"
        "tagmem.offload('spill')\n"
        "tagmem.reload('spill')\n"
        "print('intact', io.read(p, 3 << 20) == data)\n"
        "tagmem.shutdown()\n"
    ) % (os.path.dirname(os.path.abspath(__file__)), rng.getrandbits(64))
    try:
        result = _python(code, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("host_reserve(-1) then an offload did not finish within 120 s (hung)")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("refused TAGMEM_ERROR_INVALID_ARGUMENT") and "out of range" in lines[0]
    assert lines[1] == "intact True"


def test_a_tag_scope_creates_its_tag():
    assert not tagmem.exists("scoped")
    with tagmem.tag("scoped"):
        assert tagmem.exists("scoped")
        assert tagmem.state("scoped") == "resident"
        assert tagmem.stats("scoped")["live_allocations"] == 0
    assert tagmem.tags() == ["scoped"]


def test_a_forked_child_gets_forked_error_not_a_hang(io, rng):
    p = tagmem.raw_alloc(4 * MiB, tag="parent")
    data = fill(io, rng, p, 4 * MiB)
    tagmem.host_reserve(512 * MiB, wait=False)  # the pinning thread is at work during the fork
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if both calls raise ForkedError, promptly
        signal.alarm(60)
        ok = 0
        for call in (lambda: tagmem.host_trim(0), lambda: tagmem.raw_alloc(MiB, tag="child")):
            try:
                call()
            except tagmem.ForkedError as e:
                ok += "TAGMEM_ERROR_FORKED: tagmem was started in the parent process" in str(e)
            except BaseException:
                pass
        os._exit(0 if ok == 2 else 1)
    for _ in range(6000):  # up to 60 s, then the child counts as hung
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    tagmem.host_trim(0)
    assert io.read(p, 4 * MiB) == data


def test_a_failed_list_changes_no_tag(io, rng):
    p = tagmem.raw_alloc(MiB, tag="keep")
    data = fill(io, rng, p, MiB)
    with pytest.raises(tagmem.UnknownTagError):
        tagmem.offload(["keep", "missing"])
    assert tagmem.state("keep") == "resident"
    assert io.read(p, MiB) == data


def test_free_while_offloaded_is_bookkeeping_and_reload_keeps_the_rest(io, rng):
    a = tagmem.raw_alloc(MiB, tag="t")
    b = tagmem.raw_alloc(MiB, tag="t")
    db = fill(io, rng, b, MiB)
    tagmem.offload("t")
    tagmem.raw_free(a)
    assert tagmem.stats("t")["live_allocations"] == 1
    tagmem.reload("t")
    assert io.read(b, MiB) == db


# ---- statistics and caches ----------------------------------------------------------------------


def _c_struct_fields(struct):
    header = open(os.path.join(REPO_ROOT, "include", "tagmem", "tagmem.h")).read()
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return [re.findall(r"(\w+)\s*;", line)[0] for line in body.splitlines() if ";" in line]


def test_stats_are_dicts_keyed_like_the_c_structs():
    p = tagmem.raw_alloc(3 * MiB, tag="s")
    tag_stats = tagmem.stats("s")
    assert list(tag_stats) == _c_struct_fields("tagmem_tag_stats")
    assert tag_stats["state"] == "resident"
    assert tag_stats["requested_bytes"] == 3 * MiB and tag_stats["live_allocations"] == 1
    assert tag_stats["mapped_bytes"] >= 3 * MiB and tag_stats["virtual_bytes"] >= tag_stats["reserved_bytes"]
    device = tagmem.stats()
    fields = _c_struct_fields("tagmem_device_stats")
    assert list(device)[: len(fields) + 2] == fields + ["metadata_heap", "by_tag"]
    # then PyTorch's names for the same counts (test_summary.py checks their values)
    assert all("." in k for k in list(device)[len(fields) + 2 :])
    assert device["allocated_bytes.s.current"] == tag_stats["allocated_bytes"]
    assert device["metadata_heap"] in ("mimalloc", "system")
    assert device["by_tag"] == {"s": tag_stats}
    assert device["tags"] == 1 and device["allocated_bytes"] == tag_stats["allocated_bytes"]
    assert 0 < device["device_free_bytes"] <= device["device_total_bytes"]
    tagmem.raw_free(p)


def test_a_discard_tag_whose_mappings_are_parked_reports_them_as_parked_bytes(io, rng, monkeypatch):
    tagmem.shutdown()
    monkeypatch.setenv("TAGMEM_RECYCLE_PHYSICAL", "keep")  # read when tagmem initialises
    p = tagmem.raw_alloc(16 * MiB, tag="kv")
    mapped = tagmem.stats("kv")["mapped_bytes"]
    assert mapped >= 16 * MiB and tagmem.stats("kv")["parked_bytes"] == 0
    tagmem.offload("kv", mode=tagmem.DISCARD)
    s = tagmem.stats("kv")
    assert s["state"] == "offloaded_discard" and s["mapped_bytes"] == 0
    assert s["parked_bytes"] == mapped  # its addresses still map that memory
    tagmem.reload("kv")
    s = tagmem.stats("kv")
    assert s["parked_bytes"] == 0 and s["mapped_bytes"] == mapped
    data = fill(io, rng, p, 16 * MiB)
    assert io.read(p, 16 * MiB) == data
    tagmem.raw_free(p)


def test_empty_cache_returns_segments_without_live_allocations():
    keep = tagmem.raw_alloc(MiB, tag="c1")
    gone = tagmem.raw_alloc(16 * MiB, tag="c2")
    tagmem.raw_free(gone)
    assert tagmem.stats("c2")["mapped_bytes"] >= 16 * MiB  # cached
    tagmem.empty_cache()
    assert tagmem.stats("c2")["mapped_bytes"] == 0
    assert tagmem.stats("c1")["mapped_bytes"] >= MiB
    tagmem.raw_free(keep)


def test_host_store_can_be_reserved_and_trimmed():
    tagmem.host_reserve(8 * MiB, wait=True)
    assert tagmem.stats()["host_pinned_bytes"] >= 8 * MiB
    tagmem.host_trim(0)
    assert tagmem.stats()["host_pinned_bytes"] == 0


def test_a_planned_tag_offloads_and_reloads_its_bytes_and_kept_memory_can_be_released(io, rng):
    tagmem.plan_offload("planned", "backup")
    tagmem.plan_offload("planned_kv", tagmem.DISCARD)
    with pytest.raises(tagmem.InvalidArgumentError):
        tagmem.plan_offload("planned", "sideways")
    with tagmem.tag("planned"):
        ptr = tagmem.raw_alloc(4 * MiB)
    data = fill(io, rng, ptr, 4 * MiB)
    tagmem.offload("planned")
    tagmem.release_physical()
    tagmem.reload("planned")
    assert io.read(ptr, 4 * MiB) == data
    tagmem.raw_free(ptr)


def test_host_budget_refuses_an_offload_that_does_not_fit_and_keeps_the_tag(io, rng):
    tagmem.init(host_max_bytes=16 * MiB)
    assert tagmem.stats()["host_budget_bytes"] == 16 * MiB
    ptr = tagmem.raw_alloc(24 * MiB, tag="too_big")
    data = rng.randbytes(24 * MiB)
    io.write(ptr, data)
    with pytest.raises(tagmem.HostOutOfMemoryError, match="TAGMEM_HOST_MAX_BYTES"):
        tagmem.offload("too_big", mode="backup")
    assert tagmem.stats("too_big")["state"] == "resident"
    assert io.read(ptr, len(data)) == data
    assert tagmem.stats()["host_pinned_bytes"] == 0


# ---- finding the library --------------------------------------------------------------------------


def _python(code, timeout=None, **env):
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout
    )


def test_library_in_the_process_wins_over_tagmem_library():
    library = tagmem.library_file()
    run = _python(
        "import tagmem; print(tagmem.library_origin()); print(tagmem.library_file())",
        LD_PRELOAD=library,
        TAGMEM_LIBRARY="/nonexistent/libtagmem.so.1",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["process", library]


def test_a_missing_library_is_a_clear_error():
    run = _python(
        "import tagmem\n"
        "try:\n    tagmem.tags()\nexcept tagmem.LibraryNotFound as e:\n    print('LibraryNotFound', e)",
        TAGMEM_LIBRARY="/nonexistent/libtagmem.so.1",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("LibraryNotFound") and "/nonexistent/libtagmem.so.1" in run.stdout


def test_handoff_is_refused_when_off_and_reports_like_the_c_struct_when_on(monkeypatch, tmp_path):
    with pytest.raises(tagmem.InvalidArgumentError):
        tagmem.handoff_expect()
    tagmem.shutdown()
    monkeypatch.setenv("TAGMEM_HANDOFF", "on")
    monkeypatch.setenv("TAGMEM_JOB", f"python-{os.getpid()}")
    monkeypatch.setenv("TAGMEM_PEER_DIR", str(tmp_path / "peers"))
    tagmem.init()
    stats = tagmem.handoff_stats()
    assert list(stats) == _c_struct_fields("tagmem_handoff_stats")
    assert stats["listening"] is False and stats["received_bytes"] == 0
    tagmem.handoff_expect(64 * MiB)
    assert tagmem.handoff_stats()["listening"] is True
    assert any(name.startswith("hoff-") for name in os.listdir(tmp_path / "peers"))
    tagmem.handoff_cancel()
    assert tagmem.handoff_stats()["listening"] is False


def test_the_plain_api_example_of_docs_torch_md_runs_as_written():
    with open(os.path.join(REPO_ROOT, "docs", "torch.md")) as f:
        text = f.read()
    marker = "<!-- tested: torch_plain_api -->\n```python\n"
    start = text.index(marker) + len(marker)
    code = text[start : text.index("```", start)]
    exec(compile(code, "docs/torch.md", "exec"), {})
    assert tagmem.state("weights") == "offloaded_backup"
    assert tagmem.state("kv_cache") == "offloaded_discard"


# ---- replicated tags (docs/replicated.md) -----------------------------------------------------

_REPLICA = r"""
import os, random, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import tagmem
from device_io import DeviceIO
seed, rank, size = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
io, rng = DeviceIO(0), random.Random(seed)
sizes = [3 << 20, 1000, 5 << 20]
pointers = [tagmem.raw_alloc(n, tag="rep") for n in sizes]
data = [rng.randbytes(n) for n in sizes]
for p, d in zip(pointers, data):
    io.write(p, d)
tagmem.set_replicated("rep", "py", rank=rank, size=size)
tagmem.offload("rep")
moved = tagmem.stats("rep")["bytes_offloaded"]
tagmem.reload("rep")
intact = all(io.read(p, len(d)) == d for p, d in zip(pointers, data))
print(moved, tagmem.stats("rep")["mapped_bytes"], intact)
"""


@pytest.fixture
def replica_env(monkeypatch):
    """One job and one private meeting directory for this test's replicas (short: socket paths
    are limited)."""
    peer_dir = tempfile.mkdtemp(prefix="tm-")  # mode 0700
    monkeypatch.setenv("TAGMEM_JOB", f"py-replicas-{os.path.basename(peer_dir)}")
    monkeypatch.setenv("TAGMEM_PEER_DIR", peer_dir)
    yield
    shutil.rmtree(peer_dir, ignore_errors=True)


def test_replicated_tag_each_process_moves_its_share_and_reloads_every_byte(rng, replica_env):
    seed, n = rng.randrange(1 << 32), 2
    script = [sys.executable, "-c", _REPLICA, __file__, str(seed)]
    replicas = [subprocess.Popen(script + [str(r), str(n)], stdout=subprocess.PIPE, text=True)
                for r in range(n)]
    reports = [p.communicate(timeout=120)[0].split() for p in replicas]
    assert [p.returncode for p in replicas] == [0] * n
    moved = [int(r[0]) for r in reports]
    mapped = int(reports[0][1])
    assert all(r[2] == "True" for r in reports), reports
    assert sum(moved) == mapped  # the shares add up to the tag, each process moved about half
    assert all(m <= mapped // n + n * (64 << 10) for m in moved), reports


def test_replicated_tag_settings_are_checked(replica_env):
    tagmem.raw_alloc(1000, tag="rep")
    with pytest.raises(tagmem.InvalidArgumentError, match="rank 2"):
        tagmem.set_replicated("rep", "g", rank=2, size=2)
    with pytest.raises(tagmem.InvalidArgumentError, match="group name"):
        tagmem.set_replicated("rep", "no spaces", rank=0, size=2)
    with pytest.raises(tagmem.InvalidArgumentError):
        tagmem.set_replicated("rep", "g", rank=0, size=True)
    with pytest.raises(tagmem.UnknownTagError):
        tagmem.set_replicated("no-such-tag", "g", rank=0, size=2)
    tagmem.set_replicated("rep", "g", rank=0, size=2)
    tagmem.set_replicated("rep", None)  # plain again: the offload needs no replica
    tagmem.offload("rep")
    tagmem.reload("rep")
