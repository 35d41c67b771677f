"""Can this artifact run here, on that device? Answered in one line before TVM loads the library.

TVM itself would fail late and obscurely: a library from another TVM can crash on load, a cubin
for another GPU fails at the first kernel launch ("no kernel image is available"), and a CUDA
artifact on a machine without a GPU dies in the CUDA runtime.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import TunekitError
from .metadata import ArtifactMetadata

_DLPACK_KINDS = {1: "cpu", 2: "cuda"}  # DLPack device type codes (kDLCPU, kDLCUDA)


@dataclass(frozen=True)
class DeviceSpec:
    kind: str   # "cpu" or "cuda"
    index: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    def tvm_device(self):
        import tvm

        return tvm.cuda(self.index) if self.kind == "cuda" else tvm.cpu(self.index)


def parse_device(device, *, default_kind: str) -> DeviceSpec:
    """None (the artifact's own kind, device 0), "cpu", "cuda", "cuda:1", a tvm or torch device."""
    if device is None:
        return DeviceSpec(default_kind, 0)
    if hasattr(device, "dlpack_device_type"):  # a tvm.runtime.Device
        kind = _DLPACK_KINDS.get(device.dlpack_device_type())
        if kind is None:
            raise TunekitError(f"device {device} is neither a CPU nor a CUDA device")
        return DeviceSpec(kind, int(device.index))
    text = str(device).strip().lower()  # also torch.device("cuda:0")
    match = re.fullmatch(r"(cpu|cuda|gpu)(?::(\d+))?", text)
    if not match:
        raise TunekitError(f"device {device!r} is not one of: cpu, cuda, cuda:N")
    kind = "cuda" if match.group(1) == "gpu" else match.group(1)
    return DeviceSpec(kind, int(match.group(2) or 0))


def parse_arch(arch: str) -> tuple[int, int, str]:
    """'sm_90a' -> (9, 0, 'a'); 'sm_80' -> (8, 0, ''); 'sm_100' -> (10, 0, '')."""
    match = re.fullmatch(r"sm_(\d+)(\d)([a-z]?)", arch)
    if not match:
        raise TunekitError(f"unknown CUDA architecture {arch!r} in the artifact's metadata")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def arch_runs_on(arch: str, compute_version: str) -> bool:
    """Whether a cubin built for `arch` runs on a GPU of `compute_version` ("9.0").

    CUDA's rule (TVM embeds cubins, not PTX): the same major version and a minor at least as
    new; an arch-specific build (the 'a' of sm_90a, what the H100 tag gives) only on exactly
    that architecture.
    """
    major, minor, suffix = parse_arch(arch)
    dev_major, dev_minor = (int(part) for part in compute_version.split(".")[:2])
    if suffix:
        return (dev_major, dev_minor) == (major, minor)
    return dev_major == major and dev_minor >= minor


def check_build(artifact: str, meta: ArtifactMetadata, device: DeviceSpec) -> None:
    """What can be checked without touching the GPU: the TVM version and the device kind.
    (A parent process that starts MPS workers must not open a CUDA context of its own.)"""
    import tvm

    name = os.path.basename(artifact)
    if meta.tvm_version != tvm.__version__:
        raise TunekitError(f"{name} was compiled with TVM {meta.tvm_version} but this is TVM {tvm.__version__}; "
                           f"compile it again with this TVM")
    if device.kind != meta.device_kind:
        raise TunekitError(f"{name} is compiled for {meta.device_kind}; it cannot run on {device}")


def check_device(artifact: str, meta: ArtifactMetadata, device: DeviceSpec) -> None:
    """On CUDA: a GPU is there and the artifact's cubins run on its architecture."""
    if device.kind != "cuda":
        return
    name = os.path.basename(artifact)
    dev = device.tvm_device()
    if not dev.exist:
        raise TunekitError(f"{name} is a CUDA model and needs an NVIDIA GPU ({device}), but none was found")
    if meta.arch and not arch_runs_on(meta.arch, dev.compute_version):
        raise TunekitError(f"{name} was built for {meta.arch} but {device} ({dev.device_name}) is "
                           f"sm_{dev.compute_version.replace('.', '')}; compile it again for this GPU")


def check_runnable(artifact: str, meta: ArtifactMetadata, device: DeviceSpec) -> None:
    """Refuse, in one line, an artifact that cannot run here on `device`."""
    check_build(artifact, meta, device)
    check_device(artifact, meta, device)
