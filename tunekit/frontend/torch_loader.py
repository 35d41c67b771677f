"""A PyTorch module -> Relax, through `torch.export` and TVM's `from_exported_program`.

torch is optional (`pip install 'tunekit[torch]'`): nothing here is imported unless a module is
passed, and then a missing torch is one line naming the extra. The reference a tuned model is
checked against is the module itself, run eagerly in fp32 on CPU.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import TunekitError


def is_torch_module(model) -> bool:
    return any(cls.__module__.startswith("torch") and cls.__name__ == "Module" for cls in type(model).__mro__)


def _require_torch():
    try:
        import torch
    except ImportError:
        raise TunekitError("tuning a PyTorch module needs torch: pip install 'tunekit[torch]' "
                           "(or pass an ONNX file)") from None
    return torch


def module_digest(module, example_inputs) -> str:
    """What identifies a module for --resume: its class, its weights and the example inputs' shapes."""
    torch = _require_torch()
    digest = hashlib.sha256(f"{type(module).__module__}.{type(module).__qualname__}".encode())
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32 if tensor.is_floating_point() else tensor.dtype)
                      .contiguous().numpy().tobytes())
    for x in example_inputs:
        digest.update(f"{tuple(x.shape)}:{x.dtype}".encode())
    return digest.hexdigest()


def import_module(module, example_inputs: tuple):
    """(Relax module, ModelInputs, output names, reference callable) of `module` at `example_inputs`."""
    torch = _require_torch()
    from tvm.relax.frontend.torch import from_exported_program

    from .onnx_loader import ModelInputs

    if not isinstance(example_inputs, (tuple, list)) or not example_inputs \
            or not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise TunekitError("example_inputs must be a non-empty tuple of torch tensors (one per forward argument)")
    module = module.eval().to("cpu")
    inputs = tuple(x.detach().to("cpu") for x in example_inputs)
    try:
        exported = torch.export.export(module, inputs)
        mod = from_exported_program(exported, keep_params_as_input=False)
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise TunekitError(f"TVM could not import the module through torch.export: {text[:300]}") from None
    names = [f"input{i}" for i in range(len(inputs))]
    specs = ModelInputs({n: list(x.shape) for n, x in zip(names, inputs)},
                        {n: str(x.dtype).removeprefix("torch.") for n, x in zip(names, inputs)})
    ret = mod["main"].ret_ty
    count = len(ret.fields) if type(ret).__name__ == "TupleType" else 1
    output_names = [f"output{i}" for i in range(count)]

    def reference(sample: dict) -> list[np.ndarray]:
        with torch.no_grad():
            result = module(*(torch.from_numpy(sample[n]) for n in names))
        flat = result if isinstance(result, (tuple, list)) else (result,)
        return [t.detach().cpu().numpy() for t in flat]

    return mod, specs, output_names, reference
