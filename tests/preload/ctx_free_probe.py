"""Does cudaFree wait for work queued on a context made with cuCtxCreate (not the primary one)?

Allocates with cudaMalloc, queues many memsets of that memory on a stream of a context of its own,
calls cudaFree from the primary context, then asks whether the stream is still busy. Prints one
line, "ctx-free: after cudaFree the other context's stream is busy|idle (...)", and exits 0;
exit 2 means the probe itself could not run.

With --compare <libtagmem_preload.so> it runs itself twice, under CUDA alone and under the shim
with a tag (so that cudaMalloc returns tagmem's memory), and passes when both answers agree: the
shim's cudaFree is to behave as CUDA's own does here (docs/reliability.md). tests/preload/gpu_run.sh
runs it that way.
"""

import ctypes
import glob
import os
import re
import subprocess
import sys

MEMSETS = 3000
BYTES = 64 << 20
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600


def load_cudart():
    here = [os.path.join(p, "nvidia", "cuda_runtime", "lib") for p in sys.path]
    here += ["/usr/local/cuda/lib64"]
    for d in here:
        for path in sorted(glob.glob(os.path.join(d, "libcudart.so*"))):
            try:
                return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
    sys.exit("ctx-free: no libcudart found")


def check(name, status):
    if status != CUDA_SUCCESS:
        print(f"ctx-free: {name} failed with {status}")
        sys.exit(2)


def main():
    load_cudart()
    ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    # The process's own lookup: under LD_PRELOAD the shim's cudaMalloc and cudaFree come first.
    g = ctypes.CDLL(None)
    check("cudaSetDevice", g.cudaSetDevice(0))
    ptr = ctypes.c_void_p()
    check("cudaMalloc", g.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(BYTES)))
    tagged = False
    if hasattr(g, "tagmem_pointer_info"):
        tag = ctypes.create_string_buffer(64)
        tagged = g.tagmem_pointer_info(ptr, tag, ctypes.c_size_t(64), None, None, None) == 0

    dev = ctypes.c_int()
    check("cuDeviceGet", g.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    check("cuCtxCreate", g.cuCtxCreate_v4(ctypes.byref(ctx), None, ctypes.c_uint(0), dev))
    stream = ctypes.c_void_p()
    check("cuStreamCreate", g.cuStreamCreate(ctypes.byref(stream), ctypes.c_uint(0)))
    for i in range(MEMSETS):
        check("cuMemsetD8Async",
              g.cuMemsetD8Async(ptr, ctypes.c_ubyte(i & 0xFF), ctypes.c_size_t(BYTES), stream))
    popped = ctypes.c_void_p()
    check("cuCtxPopCurrent", g.cuCtxPopCurrent_v2(ctypes.byref(popped)))

    check("cudaFree", g.cudaFree(ptr))  # from the primary context, on this thread

    check("cuCtxPushCurrent", g.cuCtxPushCurrent_v2(ctx))
    query = g.cuStreamQuery(stream)
    if query not in (CUDA_SUCCESS, CUDA_ERROR_NOT_READY):
        print(f"ctx-free: cuStreamQuery failed with {query}")
        sys.exit(2)
    verdict = "busy" if query == CUDA_ERROR_NOT_READY else "idle"
    end = g.cuStreamSynchronize(stream)  # may fail: the memory it writes was freed under it
    print(f"ctx-free: after cudaFree the other context's stream is {verdict} "
          f"(memory from {'tagmem' if tagged else 'CUDA'}; the stream then ended with {end})")
    sys.stdout.flush()
    os._exit(0)  # the context may hold a sticky error: leave without tearing it down


def compare(shim):
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    runs = {"CUDA": plain, "shim": dict(plain, LD_PRELOAD=shim, TAGMEM_PRELOAD_TAG="probe")}
    verdicts = {}
    for name, env in runs.items():
        out = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                             timeout=120)
        sys.stdout.write(f"[{name}] {out.stdout}{out.stderr}")
        m = re.search(r"stream is (busy|idle) \(memory from (\w+)", out.stdout)
        if out.returncode != 0 or not m:
            print(f"ctx-free: the {name} run failed (exit {out.returncode})")
            return 1
        verdicts[name] = m.groups()
    if verdicts["shim"][1] != "tagmem":
        print("ctx-free: under the shim cudaMalloc did not return tagmem's memory")
        return 1
    if verdicts["shim"][0] != verdicts["CUDA"][0]:
        print(f"ctx-free: FAIL: CUDA's cudaFree left the stream {verdicts['CUDA'][0]}, "
              f"the shim's {verdicts['shim'][0]}")
        return 1
    print(f"ctx-free: PASS: the shim's cudaFree waits as CUDA's does "
          f"(stream {verdicts['CUDA'][0]} after it in both)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2]))
    main()
