"""Share -> TVM target. Targets are JSON dicts or tags in TVM 0.27 (CLI strings raise).

A GPU's target comes from the device itself: its compute capability (read through NVML, which,
unlike the CUDA runtime, opens no CUDA context in this process before the MPS daemon is up) picks
the architecture. When TVM has a tag for the GPU and the tag's architecture agrees, the tag is
used (it carries the GPU's L2 size); otherwise the target is built from the compute capability
and the limits every NVIDIA GPU since Kepler shares. An unreadable GPU is refused, never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TunekitError
from .shares.share import Share

# GPUs whose TVM tag has another name: same architecture and limits (the same Hopper chip with more
# and faster memory).
_TAG_ALIASES = {"h200": "nvidia/nvidia-h100"}
# Per block on every compute capability >= 3.0 (CUDA C Programming Guide, "Technical Specifications").
_CUDA_LIMITS = {"max_threads_per_block": 1024, "max_num_threads": 1024, "thread_warp_size": 32,
                "max_shared_memory_per_block": 49152, "registers_per_block": 65536}


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        # sm_90a: Hopper's arch-specific features (what TVM's Hopper tag uses too).
        return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"

    @property
    def has_tensor_cores(self) -> bool:
        """TVM's tensor-core schedule rules (cuda-tensorcore) are chosen for sm_75 and newer."""
        return self.compute_capability >= (7, 5)


def gpu_info(index: int = 0) -> GpuInfo:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        raise TunekitError(f"cannot read GPU {index}'s compute capability through NVML: {exc}") from None
    return GpuInfo(name.decode() if isinstance(name, bytes) else str(name), (int(major), int(minor)))


def _tag_for(info: GpuInfo) -> str | None:
    from tvm.target import Target

    try:
        from tvm.target import list_tags

        tags = set(list_tags())
    except Exception:
        tags = set()
    words = info.name.lower().replace("nvidia", "").split()
    # "A100-SXM4-40GB" -> a100-sxm4-40gb, a100-sxm4, a100; "GeForce RTX 3080" -> geforce-rtx-3080
    parts = [w.split("-") for w in words]
    names = ["-".join(words)] + ["-".join(p[:n]) for p in parts for n in range(len(p), 0, -1)]
    candidates = [_TAG_ALIASES.get(n) for n in names] + [t for n in names for t in (f"nvidia/nvidia-{n}", f"nvidia/{n}")]
    for tag in filter(None, candidates):
        if tag in tags and Target(tag).arch == info.arch:
            return tag
    return None


def cuda_target(info: GpuInfo):
    from tvm.target import Target

    tag = _tag_for(info)
    if tag is not None:
        return Target(tag)
    return Target({"kind": "cuda", "arch": info.arch, **_CUDA_LIMITS})


def _plain(value):
    """TVM FFI containers (Map, Array, String) and tuples -> dicts, lists and str for json.dump."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "items"):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [_plain(item) for item in value]
    return str(value)


def target_dict(target) -> dict:
    """The target as a JSON object: `Target(target_dict(t))` rebuilds it (reports, artifact metadata)."""
    return _plain(target.export())


def target_for(share: Share, *, gpu_index: int = 0):
    from tvm.target import Target

    if share.kind == "cpu":
        return Target({"kind": "llvm", "num-cores": len(share.cpu_cores())})
    return cuda_target(gpu_info(gpu_index))
