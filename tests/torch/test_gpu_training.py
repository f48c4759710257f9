"""Workloads over tagged tensors on a GPU: training steps, CUDA graphs and generation give
bit-identical results with and without offload/reload cycles in between.

Needs PyTorch and a CUDA GPU (gpu_run.sh). Deterministic kernels are requested so that the run
without offload is a valid reference; the offload cycles themselves must change nothing.
"""

import math
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tagmem
import tagmem.torch as tt
from gpu_support import MiB, SMALL, as_bytes, assert_unchanged, snapshot

NOISE = 4 * MiB  # the driver's own small allocations move free memory


@pytest.fixture(autouse=True)
def deterministic():
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def owner(t):
    return tagmem.pointer_info(t.data_ptr())["tag"]


# ---- an optimizer step after reload ---------------------------------------------------------------


def _train(prefix, offload_between_steps, steps=6):
    torch.manual_seed(0)
    with tt.tag(f"{prefix}_params"):
        model = nn.Sequential(
            nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 64)
        ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tags = [f"{prefix}_params", f"{prefix}_grads", f"{prefix}_optim"]
    generator = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for step in range(steps):
        x = torch.randn(64, 256, device="cuda", generator=generator)
        y = torch.randn(64, 64, device="cuda", generator=generator)
        with tt.tag(f"{prefix}_grads", all_threads=True):
            loss = F.mse_loss(model(x), y)
            loss.backward()
        losses.append(loss.item())
        if offload_between_steps:  # gradients must survive the cycle too
            present = [t for t in tags if t in tagmem.tags(0)]
            before = snapshot([p.grad for p in model.parameters()])
            tt.offload(present)
            tt.reload(present)
            assert_unchanged([p.grad for p in model.parameters()], before)
        with tt.tag(f"{prefix}_optim"):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if offload_between_steps:
            state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]
            before = snapshot(list(model.parameters()) + state)
            tt.offload(tags, mode="backup")
            assert all(tt.state(t) == "offloaded_backup" for t in tags)
            tt.reload(tags)
            assert_unchanged(list(model.parameters()) + state, before)
    params = [p.detach().cpu().clone() for p in model.parameters()]
    state = [v.detach().cpu().clone() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    owners = {owner(p) for p in model.parameters()}
    owners_state = {owner(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda}
    return losses, params, state, owners, owners_state


def test_optimizer_steps_after_reload_are_bit_identical_to_a_run_without_offload():
    ref_losses, ref_params, ref_state, _, _ = _train("opt_ref", offload_between_steps=False)
    losses, params, state, owners, owners_state = _train("opt_cyc", offload_between_steps=True)
    assert owners == {"opt_cyc_params"} and owners_state == {"opt_cyc_optim"}
    assert losses == ref_losses
    assert len(params) == len(ref_params) and len(state) == len(ref_state)
    for a, b in zip(params + state, ref_params + ref_state):
        assert torch.equal(as_bytes(a), as_bytes(b))


# ---- CUDA graphs --------------------------------------------------------------------------------


def _mlp(prefix):
    torch.manual_seed(3)
    with tt.tag(f"{prefix}_weights"):
        w1 = torch.randn(512, 1024, device="cuda") / 32
        w2 = torch.randn(1024, 256, device="cuda") / 32
        static_x = torch.zeros(128, 512, device="cuda")
    return w1, w2, static_x


def _forward(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def _capture(static_x, w1, w2, pool=None):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch requires
        for _ in range(2):
            _forward(static_x, w1, w2)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    kwargs = {} if pool is None else {"pool": pool}
    with torch.cuda.graph(graph, **kwargs):
        static_y = _forward(static_x, w1, w2)
    return graph, static_y


def _replay_all(graph, static_x, static_y, inputs):
    outputs = []
    for x in inputs:
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        outputs.append(static_y.clone())
    return outputs


def test_a_graph_over_tagged_tensors_replays_correctly_after_reload():
    w1, w2, static_x = _mlp("graph_a")
    graph, static_y = _capture(static_x, w1, w2)
    inputs = [torch.randn(128, 512, device="cuda") for _ in range(3)]
    expected = _replay_all(graph, static_x, static_y, inputs)
    for x, y in zip(inputs, expected):  # the graph computes what eager code computes
        torch.testing.assert_close(y, _forward(x, w1, w2))

    tt.offload("graph_a_weights")
    tt.reload("graph_a_weights")
    for y, y_again in zip(expected, _replay_all(graph, static_x, static_y, inputs)):
        assert torch.equal(as_bytes(y_again), as_bytes(y))


def test_a_graphs_private_pool_in_a_tag_can_be_discarded_and_replays_after_reload():
    w1, w2, static_x = _mlp("graph_b")
    pool = tt.pool("graph_b_pool")
    graph, static_y = _capture(static_x, w1, w2, pool=pool.id)
    assert owner(static_y) == "graph_b_pool"  # the graph's output lives in its private pool
    inputs = [torch.randn(128, 512, device="cuda") for _ in range(3)]
    expected = _replay_all(graph, static_x, static_y, inputs)
    for x, y in zip(inputs, expected):
        torch.testing.assert_close(y, _forward(x, w1, w2))

    free_before = torch.cuda.mem_get_info()[0]
    mapped = tt.stats("graph_b_pool")["mapped_bytes"]
    assert mapped > 0
    tt.offload("graph_b_pool", mode="discard")  # intermediates and outputs: recomputed anyway
    tt.offload("graph_b_weights", mode="backup")
    assert torch.cuda.mem_get_info()[0] >= free_before + mapped - NOISE
    tt.reload(["graph_b_weights", "graph_b_pool"])
    for y, y_again in zip(expected, _replay_all(graph, static_x, static_y, inputs)):
        assert torch.equal(as_bytes(y_again), as_bytes(y))
    graph.reset()


# ---- generation with a small transformer-free model ---------------------------------------------


class Block(nn.Module):
    """Pre-norm attention with a KV cache, then an MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x, cache, start):
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        cache[0, :, :, start:start + n] = k
        cache[1, :, :, start:start + n] = v
        keys, values = cache[0, :, :, : start + n], cache[1, :, :, : start + n]
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(d // h)
        causal = torch.ones(n, start + n, device=x.device, dtype=torch.bool).tril(start)
        attention = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ values
        x = x + self.proj(attention.transpose(1, 2).reshape(b, n, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=1000, d=256, heads=4, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, caches, start):
        x = self.embed(tokens)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache, start)
        return self.head(x)


@torch.no_grad()
def _generate(model, caches, prompt, steps):
    tokens, logits_seen = prompt, []
    logits = model(prompt, caches, 0)[:, -1]
    for i in range(steps):
        logits_seen.append(logits)
        nxt = logits.argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], 1)
        logits = model(nxt, caches, tokens.shape[1] - 1)[:, -1]
    return tokens, torch.stack(logits_seen)


def test_generation_is_identical_before_and_after_a_full_offload():
    torch.manual_seed(4)
    steps = 16 if SMALL else 48
    with tt.tag("gen_weights"):
        model = TinyLM().cuda().eval()
    with tt.tag("gen_kv_cache"):
        caches = [torch.zeros(2, 2, 4, 8 + steps, 64, device="cuda") for _ in model.blocks]
    prompt = torch.randint(0, 1000, (2, 8), device="cuda")
    tokens, logits = _generate(model, caches, prompt, steps)
    weights = list(model.parameters())
    before = snapshot(weights)
    cache_ptrs = [c.data_ptr() for c in caches]

    free_before = torch.cuda.mem_get_info()[0]
    mapped = tt.stats("gen_weights")["mapped_bytes"] + tt.stats("gen_kv_cache")["mapped_bytes"]
    tt.offload("gen_weights", mode="backup")
    tt.offload("gen_kv_cache", mode="discard")  # the cache is rebuilt by the next prefill
    tt.wait_released()  # DISCARD hands the memory back on a background thread
    assert torch.cuda.mem_get_info()[0] >= free_before + mapped - NOISE
    tt.reload(["gen_weights", "gen_kv_cache"])
    assert_unchanged(weights, before)
    assert [c.data_ptr() for c in caches] == cache_ptrs

    tokens_again, logits_again = _generate(model, caches, prompt, steps)
    assert torch.equal(tokens_again, tokens)
    assert torch.equal(as_bytes(logits_again), as_bytes(logits))
