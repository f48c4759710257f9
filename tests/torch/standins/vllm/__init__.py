"""A stand-in for the vllm package with its sleep-mode module layout (tests only)."""
