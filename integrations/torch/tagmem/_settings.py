"""The TAGMEM_* environment variables that tagmem reads, with their defaults, for
``python -m tagmem config``.

The library checks and applies them itself (at tagmem_init, or when the shim or the NCCL
integration starts); this list only shows what is in effect. Its documentation lives in README.md
(Configuration), docs/nccl.md and docs/torch.md; tests/torch/test_cli.py checks that every
variable the sources read is listed here.
"""

# (variable, default as the documentation states it, what it sets)
SETTINGS = (
    # The allocator (README.md, Configuration).
    ("TAGMEM_LIBCUDA", "libcuda.so.1", "the CUDA driver library to load"),
    ("TAGMEM_CHUNK_BYTES", "2 MiB", "physical chunk for segments of small requests"),
    ("TAGMEM_ARENA_BYTES", "256 GiB", "virtual address space reserved per tag at a time"),
    ("TAGMEM_COPY_PIECE_BYTES", "64 MiB", "size of one offload/reload copy"),
    ("TAGMEM_MAX_MAPPING_BYTES", "1 GiB", "largest physical allocation a reload coalesces into"),
    ("TAGMEM_DISCARD_MAPPING_BYTES", "16 GiB", "the same for a tag offloaded with DISCARD"),
    ("TAGMEM_DISCARD_RELEASE", "background", "when a DISCARD offload gives memory back"),
    ("TAGMEM_SWAP_RELEASE", "background", "when a swap gives its out-side memory back"),
    ("TAGMEM_COPY_STREAMS", "2", "copy streams per direction per device"),
    ("TAGMEM_HOST_SLAB_BYTES", "256 MiB", "the pinned host store grows by at least this"),
    ("TAGMEM_HOST_PIN", "register", "how the host store pins"),
    ("TAGMEM_HOST_PIN_THREADS", "min(cores, 16)", "threads that touch pages while pinning"),
    ("TAGMEM_HOST_MAX_BYTES", "(from the machine)", "most the pinned host store may hold"),
    ("TAGMEM_METADATA", "mimalloc", "where tagmem's own records live: mimalloc or system"),
    ("TAGMEM_MIMALLOC_LIBRARY", "libmimalloc.so.2", "the mimalloc library for the records"),
    # The emulated driver (libtagmem_emu.so).
    ("TAGMEM_EMU_DEVICE_COUNT", "2", "emulated devices"),
    ("TAGMEM_EMU_DEVICE_BYTES", "8 GiB", "memory of each emulated device"),
    ("TAGMEM_EMU_CONTEXT_BYTES", "0", "device memory each emulated context takes"),
    # The LD_PRELOAD shim and NCCL (docs/nccl.md).
    ("TAGMEM_PRELOAD_TAG", "(unset)", "route every cudaMalloc of the process to this tag"),
    ("TAGMEM_PRELOAD_DRIVER_CALLERS", "libnccl", "libraries whose driver lookups are wrapped"),
    ("TAGMEM_PRELOAD_LOG", "(unset)", "1: the shim logs its decisions on stderr"),
    ("TAGMEM_NCCL_JOB", "(from torchrun or Slurm)", "the job an NCCL pause/resume group belongs to"),
    ("TAGMEM_NCCL_GROUP", "nccl", "NCCL pause/resume group name, within the job"),
    ("TAGMEM_NCCL_TIMEOUT_MS", "60000", "bound on every wait of a pause or resume"),
    ("TAGMEM_NCCL_DIR", "$XDG_RUNTIME_DIR/tagmem", "rendezvous directory (else one per job)"),
    ("TAGMEM_NCCL_CUMEMALLOC", "passthrough", "passthrough or vmm for NCCL's cuMemAlloc"),
    ("TAGMEM_NCCL_CLASSIC_MIN_BYTES", "1 MiB", "smallest NCCL cuMemAlloc the vmm mode serves"),
    # The Python package (docs/torch.md).
    ("TAGMEM_LIBRARY", "(package)", "libtagmem to load"),
    ("TAGMEM_TORCH_LIBRARY", "(package)", "libtagmem_torch_alloc.so to load"),
    ("TAGMEM_PRELOAD_LIBRARY", "(package)", "libtagmem_preload.so to use"),
    ("TAGMEM_AS_TORCH_MEMORY_SAVER", "(unset)", "1: tagmem serves torch_memory_saver"),
    ("TAGMEM_AS_VLLM_CUMEM", "(unset)", "1: tagmem serves vLLM's sleep mode"),
)
