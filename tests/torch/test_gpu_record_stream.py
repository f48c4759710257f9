"""tensor.record_stream() in global mode (tagmem.torch.install() through libtagmem_libtorch.so):
a tensor used on a busy side stream, recorded there and freed, must not have its memory handed to
a new tensor before the side stream's work is done. Each case runs in a fresh process (global mode
must be installed before CUDA initialises). The same case with the hook switched off
(TAGMEM_TORCH_RECORD_STREAMS=off) must see the new tensor overwritten, which shows the check can fail.

Needs PyTorch, a CUDA GPU and TAGMEM_LIBTORCH_LIBRARY (gpu_run.sh's libtorch step sets it).
"""

import json
import os
import subprocess
import sys
import textwrap

import torch  # noqa: F401  (a collection error without PyTorch, never a silent pass)

# Note [recorded stream test] (integrations/torch/libtorch/libtorch_test.cpp) in Python: x is
# written by a side stream only after a long sleep kernel there; x is recorded on the side stream
# and freed; y, allocated at once on the default stream, gets x's memory and random bytes.
CASE = """
import json, torch, tagmem, tagmem.torch as tt
tt.install()
n = 64 << 20
g = torch.Generator().manual_seed(int(SEED))
data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
x = torch.zeros(n, dtype=torch.uint8, device="cuda")
x_ptr = x.data_ptr()
torch.cuda.synchronize()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    torch.cuda._sleep(3 << 30)  # a second or more of clock cycles
    x.fill_(0xA5)
x.record_stream(side)
del x
y = torch.empty(n, dtype=torch.uint8, device="cuda")
same = y.data_ptr() == x_ptr
y.copy_(data.cuda())
torch.cuda.synchronize()
differing = int((y.cpu() != data).sum())
print(json.dumps({"full": tt.full_support(), "same_memory": same, "differing": differing,
                  "joined_frees": tt.joined_frees()}))
"""


def run_case(seed, **env_changes):
    if not os.environ.get("TAGMEM_LIBTORCH_LIBRARY"):
        raise AssertionError(
            "TAGMEM_LIBTORCH_LIBRARY is not set: gpu_run.sh's libtorch step builds "
            "libtagmem_libtorch.so and sets it"
        )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.update(env_changes)
    code = textwrap.dedent(CASE).replace("SEED", str(seed))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["full"], "global mode did not run through libtagmem_libtorch.so"
    assert out["same_memory"], f"y did not get x's memory: the case shows nothing ({out})"
    return out


def test_memory_of_a_tensor_recorded_on_a_busy_stream_is_not_reused_before_that_stream_is_done():
    out = run_case(101)
    assert out["differing"] == 0, f"{out['differing']} bytes of the new tensor were overwritten"
    assert out["joined_frees"] >= 1


def test_without_the_hook_the_busy_stream_overwrites_the_new_tensor():
    out = run_case(102, TAGMEM_TORCH_RECORD_STREAMS="off")
    assert out["joined_frees"] == 0
    assert out["differing"] > 0, "untracked, the side stream's late write should have landed"
