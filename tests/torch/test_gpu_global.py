"""Global mode (tagmem.torch.install()) on a GPU, each case in a fresh Python process: PyTorch can
change its allocator only before CUDA initialises, which a pytest process has long done.

Needs PyTorch and a CUDA GPU (gpu_run.sh).
"""

import os
import subprocess
import sys
import textwrap

import torch  # noqa: F401  (a collection error without PyTorch, never a silent pass)


def run(code, **env_changes):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def test_global_mode_puts_every_allocation_in_the_thread_scope_and_survives_offload():
    out = run(
        """
        import torch, tagmem, tagmem.torch as tt
        tt.install()
        tt.install()  # harmless twice
        assert tt.installed()
        torch.manual_seed(0)
        with tt.tag("g_weights"):
            w = torch.randn(1024, 1024, device="cuda")
            flat = torch.randn(1 << 22, device="cuda")
        x = torch.randn(1024, 64, device="cuda")
        view = flat[12345:112345].view(1000, 100)
        info = lambda t: tagmem.pointer_info(t.data_ptr())["tag"]
        assert info(w) == "g_weights" and info(view) == "g_weights" and info(x) == "default"
        ref = [t.cpu().clone() for t in (w, view)]
        product = (w @ x).cpu()  # cuBLAS workspaces come from tagmem too
        ptrs = [w.data_ptr(), view.data_ptr()]
        free = torch.cuda.mem_get_info()[0]
        tt.offload("g_weights")
        assert tt.stats("g_weights")["mapped_bytes"] == 0
        assert torch.cuda.mem_get_info()[0] >= free + 16 * 2**20
        try:
            with tt.tag("g_weights"):
                torch.empty(10, device="cuda")
            raise SystemExit("allocating in an offloaded tag did not fail")
        except RuntimeError as e:
            assert "TAGMEM_ERROR_TAG_OFFLOADED" in str(e), e
        tt.reload("g_weights")
        assert [w.data_ptr(), view.data_ptr()] == ptrs
        assert torch.equal(w.cpu(), ref[0]) and torch.equal(view.cpu(), ref[1])
        assert torch.equal((w @ x).cpu(), product)
        try:
            torch.cuda.memory_reserved()
            reserved = "works"
        except RuntimeError as e:
            reserved = "raises"
        torch.cuda.empty_cache()  # a no-op for the bare pluggable allocator, must not fail
        del w, flat, view
        tt.empty_cache()
        print("memory_reserved", reserved, "mapped_after_free", tt.stats("g_weights")["mapped_bytes"],
              "full", tt.full_support())
        """,
        TAGMEM_LIBTORCH_LIBRARY="none",
    )
    # Documented in docs/torch.md: without libtagmem_libtorch.so, PyTorch's pluggable allocator
    # has no statistics.
    assert "memory_reserved raises" in out and "full False" in out
    assert "mapped_after_free 0" in out


def test_global_mode_through_libtorch_answers_memory_stats_and_empty_cache():
    if not os.environ.get("TAGMEM_LIBTORCH_LIBRARY"):
        raise AssertionError(
            "TAGMEM_LIBTORCH_LIBRARY is not set: gpu_run.sh's libtorch step builds "
            "libtagmem_libtorch.so and sets it"
        )
    out = run(
        """
        import torch, tagmem, tagmem.torch as tt
        tt.install()
        assert tt.full_support()
        with tt.tag("s_w"):
            a = torch.empty(48 * 2**20, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 * 2**20 + 5, dtype=torch.uint8, device="cuda")
        requested = sum(tt.stats(n)["requested_bytes"] for n in tagmem.tags(0))
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == requested, (stats, requested)
        assert torch.cuda.memory_allocated() == requested
        assert torch.cuda.memory_reserved() == tt.stats()["reserved_bytes"]
        peak = torch.cuda.max_memory_allocated()
        del a
        assert torch.cuda.memory_allocated() == requested - 48 * 2**20
        assert torch.cuda.max_memory_allocated() == peak
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
        assert tt.stats("s_w")["mapped_bytes"] > 0
        torch.cuda.empty_cache()  # reaches tagmem_empty_cache
        print("mapped_after_empty_cache", tt.stats("s_w")["mapped_bytes"])
        """
    )
    assert "mapped_after_empty_cache 0" in out


def test_install_after_cuda_initialised_is_a_clear_error():
    out = run(
        """
        import torch, tagmem, tagmem.torch as tt
        torch.zeros(1, device="cuda")
        try:
            tt.install()
        except tagmem.InvalidArgumentError as e:
            print("refused:", e)
        assert not tt.installed()
        with tt.tag("late_pool"):  # MemPool mode still works
            t = torch.ones(4, device="cuda")
        assert tagmem.pointer_info(t.data_ptr())["tag"] == "late_pool"
        """
    )
    assert "refused: TAGMEM_ERROR_INVALID_ARGUMENT" in out and "before CUDA initialises" in out
