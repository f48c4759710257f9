"""The benches' workload: Llama-3-8B-shaped bf16 weights as PyTorch parameters.

Kept apart from the methods under test so that a process measuring one method (tagmem,
torch_memory_saver, vLLM's allocator) loads only that method's code.
"""


def llama8b_shapes(layers, scale):
    """(name, shape) of the Llama-3-8B weights; --scale divides every width."""
    hidden, inter, vocab, kv = 4096 // scale, 14336 // scale, 128256 // scale, 1024 // scale
    shapes = [("embed_tokens", (vocab, hidden))]
    for i in range(layers):
        shapes += [
            (f"layers.{i}.q_proj", (hidden, hidden)),
            (f"layers.{i}.k_proj", (kv, hidden)),
            (f"layers.{i}.v_proj", (kv, hidden)),
            (f"layers.{i}.o_proj", (hidden, hidden)),
            (f"layers.{i}.gate_proj", (inter, hidden)),
            (f"layers.{i}.up_proj", (inter, hidden)),
            (f"layers.{i}.down_proj", (hidden, inter)),
            (f"layers.{i}.input_layernorm", (hidden,)),
            (f"layers.{i}.post_attention_layernorm", (hidden,)),
        ]
    return shapes + [("norm", (hidden,)), ("lm_head", (vocab, hidden))]


def make_parameters(shapes, seed):
    """Random bf16 parameters of `shapes` on the current device (in whatever pool is active)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    params = []
    for _, shape in shapes:
        p = nn.Parameter(torch.empty(shape, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
        p.data.normal_()
        params.append(p)
    torch.cuda.synchronize()
    return params
