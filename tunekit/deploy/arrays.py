"""The boundary between the caller's arrays (numpy, torch) and TVM tensors.

torch stays optional: nothing here imports it. A torch tensor is recognised by its type's module
and crosses into TVM through DLPack, without a copy (on the GPU too); outputs go back the same way.
"""
from __future__ import annotations

import numpy as np

from .compat import DeviceSpec
from .metadata import ArtifactMetadata, TensorSpec

NUMPY, TORCH = "numpy", "torch"
# tvm.runtime.from_dlpack refuses memory aligned to less: TVM's generated code assumes it.
TVM_ALIGNMENT = 64


def array_kind(value) -> str | None:
    """"numpy", "torch", or None for anything else (lists, scalars, other frameworks)."""
    if isinstance(value, np.ndarray):
        return NUMPY
    if type(value).__module__.startswith("torch") and hasattr(value, "__dlpack__"):
        return TORCH
    return None


def _dtype_name(value, kind: str) -> str:
    return value.dtype.name if kind == NUMPY else str(value.dtype).removeprefix("torch.")


def _device_of(value, kind: str) -> DeviceSpec:
    if kind == NUMPY:
        return DeviceSpec("cpu", 0)
    return DeviceSpec(value.device.type, value.device.index or 0)


def input_problem(spec: TensorSpec, value, *, device: DeviceSpec) -> str | None:
    """What is wrong with `value` as the input `spec` of a model on `device`, or None.

    numpy arrays are host memory and are copied to the device; a torch tensor must already be on
    the model's device, since moving it silently would hide a copy the caller thinks is free.
    """
    kind = array_kind(value)
    if kind is None:
        return f"expected a numpy array or torch tensor, got {type(value).__name__}"
    shape, dtype = [int(d) for d in value.shape], _dtype_name(value, kind)
    if shape != list(spec.shape) or dtype != spec.dtype:
        return f"expected {spec.describe()}, got shape {shape} {dtype}"
    where = _device_of(value, kind)
    if kind == TORCH and where != device:
        return f"expected a tensor on {device}, got one on {where}"
    return None


def to_tvm(value, *, device: DeviceSpec):
    """A TVM tensor on `device` holding `value` (checked already by input_problem)."""
    import tvm

    if array_kind(value) == NUMPY:
        return tvm.runtime.tensor(np.ascontiguousarray(value), device.tvm_device())
    tensor = value.detach()  # DLPack refuses tensors that require grad; detach() copies nothing
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()  # the compiled kernels index dense row-major memory
    if tensor.data_ptr() % TVM_ALIGNMENT:
        tensor = tensor.clone()  # a view at an odd offset (x[1:]): a fresh allocation is aligned
    # The returned tensor shares the torch tensor's memory (no copy, on the GPU too).
    return tvm.runtime.from_dlpack(tensor)


def from_tvm(tensor, *, kind: str):
    """An output back as the kind of array the inputs were: numpy (copied to host) or torch
    (sharing the TVM tensor's memory, on the model's device)."""
    if kind == TORCH:
        import torch

        return torch.from_dlpack(tensor)
    return tensor.numpy()


def random_inputs(meta: ArtifactMetadata, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the artifact's shapes and dtypes; integer inputs (token ids, masks) small and valid,
    as the tuner's own measurements use them."""
    from ..frontend.onnx_loader import ModelInputs

    specs = ModelInputs({s.name: list(s.shape) for s in meta.inputs}, {s.name: s.dtype for s in meta.inputs})
    return specs.random(seed=seed)
