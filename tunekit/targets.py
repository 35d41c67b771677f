"""Share -> TVM target. Targets are JSON dicts or tags in TVM 0.27 (CLI strings raise)."""
from __future__ import annotations

from .shares.share import Share

# Known GPU name fragments -> TVM target tags (the tag carries arch and max_threads_per_block).
_GPU_TAGS = {"H100": "nvidia/nvidia-h100", "H200": "nvidia/nvidia-h100", "A100": "nvidia/nvidia-a100"}


def target_for(share: Share, *, gpu_name: str | None = None):
    from tvm.target import Target

    if share.kind == "cpu":
        return Target({"kind": "llvm", "num-cores": len(share.cpu_cores())})
    for fragment, tag in _GPU_TAGS.items():
        if gpu_name and fragment in gpu_name:
            return Target(tag)
    return Target({"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
                   "thread_warp_size": 32})
